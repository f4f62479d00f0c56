"""Ends what an embedded Ray started when the driver that started it dies without shutting it down.

A driver killed with SIGKILL (or by the OOM killer) never runs `ray.shutdown`. Ray's GCS, raylet and
workers go with it, but the raylet's `ray::DashboardAgent` and `ray::RuntimeEnvAgent` stay for about a
minute: they notice the raylet is gone at once, then wait on the dead GCS to report it. So a driver that
starts an embedded Ray also starts this small process (`python -I .../watchdog.py PID`, in a session of
its own, so that a closing terminal or a kill of the driver's process group leaves it
be). It notes the driver's descendants every `POLL_S` seconds; once the driver is gone it ends those still
running (SIGTERM, then SIGKILL after `GRACE_S`). A driver that ends normally stops it after
`ray.shutdown`, and it does nothing; a driver stopped by a signal leaves it to end its Ray (see
`cluster.ray_session`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

import psutil

POLL_S = 1.0  # how often the driver's descendants are noted and its life checked
GRACE_S = 5.0  # between SIGTERM and SIGKILL


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (`is_running` also tells a reused PID from the process noted)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def watch(driver_pid: int, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> list[int]:
    """Until the driver dies, note its descendants; then end those still running. Returns their PIDs."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return []
    noted: dict[int, psutil.Process] = {}
    while alive(driver):
        with contextlib.suppress(psutil.NoSuchProcess):
            noted.update((p.pid, p) for p in driver.children(recursive=True) if p.pid != os.getpid())
        time.sleep(poll_s)
    left = [p for p in noted.values() if alive(p)]
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    for process in psutil.wait_procs(left, timeout=grace_s)[1]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return [p.pid for p in left]


@contextlib.contextmanager
def watching(driver_pid: int | None = None) -> Iterator[subprocess.Popen]:
    """A watchdog over this process (or `driver_pid`) while the body runs; stopped when it ends, unless a
    signal stopped it (`stopping.Stopped`): the driver then exits at once and the watchdog ends the rest."""
    from ..stopping import Stopped  # here: as a script, this module imports nothing of the package

    # Run as a script in isolated mode: it needs only psutil, not this package (nor a PYTHONPATH to find it).
    watchdog = subprocess.Popen(
        [sys.executable, "-I", __file__, str(os.getpid() if driver_pid is None else driver_pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield watchdog
    except Stopped:
        raise  # left to end what the driver started once the driver, stopping at once, has exited
    except BaseException:
        _stop(watchdog)
        raise
    _stop(watchdog)


def _stop(watchdog: subprocess.Popen) -> None:
    watchdog.terminate()
    watchdog.wait()


if __name__ == "__main__":
    watch(int(sys.argv[1]))
