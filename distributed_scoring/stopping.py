"""Stopped the way schedulers stop jobs: SIGTERM (what Slurm, Kubernetes and systemd send) and SIGINT
(Ctrl-C) end a command with one line and a code of their own.

The first signal raises `Stopped` in the main thread, wherever the command is: its context managers unwind
as on any error, so the output folder's lock is released, an embedded Ray is shut down, and a shard cut
short leaves at most a temporary file without a marker (never a row of the run; the next run removes it).
The CLI prints `dscore: stopped by SIGTERM: N of M shards done; rerun the same command to resume` and exits
128 + the signal's number (130 for SIGINT, 143 for SIGTERM; docs/runs.md). A second signal while the first
one unwinds exits at once.

`Stopped` is a BaseException, like KeyboardInterrupt, so that no `except Exception` on the way out takes it
for an error of the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A command stopped by a signal; `shards`: (done, planned) of the run it stopped, once a run knows."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.shards: tuple[int, int] | None = None
        self.detail: str | None = None  # what the stop did, where a run's shards do not tell (a submitted job)
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


class _Handler:
    """Raises `Stopped` on the first signal, exits at once on the second."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.stopping:
            os._exit(128 + signum)
        self.stopping = True
        raise Stopped(signum)


_handler = _Handler()


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
    Python, a test)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _handler.stopping = False
    install()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
