"""A local multi-process Ray cluster (cluster/local_cluster.sh) for tests that submit to it or kill its nodes."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["bash", str(REPO / "cluster" / "local_cluster.sh")]


def running(pid: int) -> bool:
    """Alive and not a zombie (this machine's init reaps orphans late)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def node_pids(state: Path) -> list[int]:
    """The `ray start --block` PIDs of the cluster started in `state`: head first, then the workers."""
    return [int(p) for p in (state / "pids").read_text().split()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(workers: int, cpus: int) -> Iterator[tuple[dict, Path]]:
    """(environment that points `ray job submit` and `dscore --ray` at it, its state folder with the
    `pids` of its `ray start --block` processes: head first). Stopped on exit; only its own processes end.
    Its nodes inherit this environment, with conftest's RAY_CAPS (object store, idle workers), and may write
    bytecode."""
    # Ray's socket paths must stay under 107 bytes, so the cluster's folder is short, not under tmp_path.
    state = Path(tempfile.mkdtemp(prefix="dsc-", dir="/tmp"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # A job imports the package from its unpacked working directory, which holds no bytecode (__pycache__ is
    # git-ignored, so `ray job submit` leaves it out): where the environment forbids writing bytecode (these
    # machines set PYTHONDONTWRITEBYTECODE), each of a job's processes would compile the package again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = [
        *SCRIPT,
        "start",
        "--dir",
        str(state),
        "--workers",
        str(workers),
        "--cpus",
        str(cpus),
        "--port",
        str(free_port()),
        "--dashboard-port",
        str(free_port()),
    ]
    subprocess.run(start, env=env, check=True, timeout=240)
    started = node_pids(state)
    exports = subprocess.run([*SCRIPT, "env", "--dir", str(state)], env=env, check=True, capture_output=True, text=True)
    variables = dict(line.removeprefix("export ").split("=", 1) for line in exports.stdout.split("\n") if line)
    try:
        yield {**env, **variables}, state
    finally:
        if (state / "pids").exists():  # a test may have restarted it: its processes now
            started += node_pids(state)
        subprocess.run([*SCRIPT, "stop", "--dir", str(state)], env=env, check=True, timeout=120)
    assert not any(running(pid) for pid in started)


def wait_for_alive_nodes(env: dict, state: Path, alive: int, limit_s: float = 120) -> None:
    """Until the cluster's `status` counts `alive` live nodes. A killed node stays alive to Ray until its
    health checks fail (about 15-30 s): a run started before that plans for it and places actors on it."""
    deadline = time.monotonic() + limit_s
    while True:
        done = subprocess.run(
            [*SCRIPT, "status", "--dir", str(state)], env=env, capture_output=True, text=True, timeout=120
        )
        if done.stdout.startswith(f"{alive} of "):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"after {limit_s:.0f} s, {done.stdout.strip() or done.stderr.strip()}")
        time.sleep(1)
