"""Stopped the way schedulers stop jobs: SIGTERM (what Slurm, Kubernetes and systemd send) and SIGINT
(Ctrl-C) end a command with one line and a code of their own, within a scheduler's grace period.

The first signal raises `Stopped` in the main thread, wherever the command is: its context managers unwind
as on any error, so the output folder's lock is released and a shard cut short leaves at most a temporary
file without a marker (never a row of the run; the next run removes it). The CLI prints `dscore: stopped by
SIGTERM: N of M shards done; rerun the same command to resume` and exits 128 + the signal's number (130 for
SIGINT, 143 for SIGTERM; docs/runs.md).

Three things keep that true at any instant:
- A signal sent to the whole process group reaches the driver more than once (`timeout` sends it to the
  command, then to its group); a repeat within `REPEAT_S` of the first is the same stop. A second signal
  after that exits at once.
- A step that must not be cut in two (a lock created and noted as held) runs `deferred()`: a signal during
  it raises `Stopped` once it is done.
- `DEADLINE_S` after the first signal, whatever the unwinding is still doing (an object store that does not
  answer), the cleanups registered with `at_deadline` run (the lock's release), the line is printed and
  the process exits.

`Stopped` is a BaseException, like KeyboardInterrupt, so that no `except Exception` on the way out takes it
for an error of the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 1.0  # a signal again within this of the first: the same stop, delivered twice
DEADLINE_S = 7.0  # from the first signal to the exit, within Kubernetes' 30 s and Slurm's usual grace
CLEANUP_S = 1.5  # what the cleanups get at the deadline


class Stopped(BaseException):
    """A command stopped by a signal; `shards`: (done, planned) of the run it stopped, once a run knows."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.shards: tuple[int, int] | None = None
        self.detail: str | None = None  # what the stop did, where a run's shards do not tell (a submitted job)
        self.told = False  # its line was printed
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        """The one line the CLI prints."""
        if self.detail:
            return f"stopped by {self.name}: {self.detail}"
        done = f": {self.shards[0]} of {self.shards[1]} shards done" if self.shards else ""
        return f"stopped by {self.name}{done}; rerun the same command to resume"

    def tell(self, fd: int | None = None) -> None:
        """Print the line (once) on stderr, or write it to file descriptor `fd`."""
        if self.told:
            return
        self.told = True
        if fd is None:
            print(f"dscore: {self.line()}", file=sys.stderr, flush=True)
        else:
            os.write(fd, f"dscore: {self.line()}\n".encode())


class _Handler:
    """Raises `Stopped` on the first signal (held while `deferred`), exits at once on a later one."""

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None  # the stop's deadline (`_deadline`)
        self.reset()

    def reset(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        self.stop: Stopped | None = None
        self.at: float = 0.0
        self.deferring = 0
        self.pending = False
        self.terminal: int | None = None  # stderr as the command found it (Ray's session pipes fd 2 through a thread)

    def __call__(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.stop is not None:
            if now - self.at < REPEAT_S:
                return
            os._exit(128 + signum)
        self.stop, self.at = Stopped(signum), now
        self.timer = _deadline(self.stop)
        if self.deferring:
            self.pending = True
            return
        raise self.stop


_handler = _Handler()
_cleanups: list[Callable[[], None]] = []


def _deadline(stop: Stopped) -> threading.Timer:
    """The exit `DEADLINE_S` from now, cancelled when the command returns first (`stopping_on_signals`)."""

    def last_resort() -> None:
        cleaning = threading.Thread(target=_clean_up, daemon=True, name="dscore-stop-cleanup")
        cleaning.start()
        cleaning.join(CLEANUP_S)  # a store that does not answer must not hold the exit
        with contextlib.suppress(Exception):
            stop.tell(_handler.terminal)
        os._exit(stop.exit_code)

    timer = threading.Timer(DEADLINE_S, last_resort)
    timer.daemon = True
    timer.start()
    return timer


def _clean_up() -> None:
    for cleanup in list(_cleanups):
        with contextlib.suppress(Exception):
            cleanup()


def signalled() -> bool:
    """A signal is stopping the command."""
    return _handler.stop is not None


def at_deadline(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` should the process end at the deadline before its unwinding did (`forget` it once
    done)."""
    _cleanups.append(cleanup)


def forget(cleanup: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        _cleanups.remove(cleanup)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal during the body raises `Stopped` when the body is done (in the main thread; elsewhere
    signals never arrive)."""
    _handler.deferring += 1
    try:
        yield
    finally:
        _handler.deferring -= 1
    if not _handler.deferring and _handler.pending:
        _handler.pending = False
        raise _handler.stop


def before_start() -> None:
    """Until the command runs (`stopping_on_signals`), a signal prints the line and exits: nothing is
    claimed or written before (the `dscore` console script)."""

    def stop_now(signum: int, frame: object) -> None:
        Stopped(signum).tell(2)
        os._exit(128 + signum)

    for signum in SIGNALS:
        signal.signal(signum, stop_now)


def install() -> None:
    """Handle SIGTERM and SIGINT as this module says (in the main thread only: Python delivers signals
    there). Called again after `ray.init`, whose core worker installs a handler of its own for SIGTERM
    (a crash dump and exit 134)."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _handler)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """The handlers installed while a command runs, the previous ones back after it (a command called from
    Python, a test), its deadline cancelled: a stop's line is printed inside (the CLI's `main`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _handler.reset()
    _handler.terminal = os.dup(2)
    install()
    try:
        yield
    finally:
        os.close(_handler.terminal)
        _handler.reset()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
