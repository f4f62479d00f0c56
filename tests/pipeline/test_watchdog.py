"""The embedded Ray's watchdog: a killed driver's descendants are ended (one that ignores SIGTERM too), and a
driver that ends normally leaves them be. With a real driver and Ray: tests/faults/test_kills.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from distributed_scoring.pipeline import watchdog
from distributed_scoring.pipeline.watchdog import watching

# A driver that starts a child ignoring SIGTERM (as Ray's agents, waiting on a dead GCS, do not end
# at once), prints the child's PID, and waits.
DRIVER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(300)
"""


def start_driver() -> tuple[subprocess.Popen, psutil.Process]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    return driver, psutil.Process(int(driver.stdout.readline()))


def gone_within(process: psutil.Process, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not watchdog.alive(process):
            return True
        time.sleep(0.1)
    return False


def test_a_killed_drivers_descendants_are_ended():
    driver, child = start_driver()
    try:
        with watching(driver.pid) as guard:
            time.sleep(2 * watchdog.POLL_S + 0.5)  # the watchdog has noted the child
            driver.send_signal(signal.SIGKILL)
            driver.wait()
            assert gone_within(child, watchdog.GRACE_S + 10), "the killed driver's child outlived it"
            assert guard.wait(timeout=10) == 0  # its work done, the watchdog ends
    finally:
        if watchdog.alive(child):
            child.kill()


def test_without_a_watchdog_the_child_outlives_its_killed_driver():
    """What the watchdog is for: the orphan stays (the test above would fail without it)."""
    driver, child = start_driver()
    try:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert not gone_within(child, 3)
    finally:
        child.kill()


def test_a_driver_that_ends_normally_stops_its_watchdog_and_nothing_is_ended():
    driver, child = start_driver()
    try:
        with watching(driver.pid) as guard:
            time.sleep(2 * watchdog.POLL_S + 0.5)
        assert guard.poll() is not None
        driver.kill()  # after the watchdog stopped: nothing ends the child now
        driver.wait()
        assert not gone_within(child, 3)
    finally:
        child.kill()
