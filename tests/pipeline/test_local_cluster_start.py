"""`cluster/local_cluster.sh start` says each step before it waits on it and names the log its node writes: it
once printed nothing for 30-57 s while a head and two workers started. Its nodes here are stand-ins (a `ray`
on PATH that says "Ray runtime started" and waits for SIGTERM, a `python` that counts them alive), so no Ray
starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers.local_cluster import SCRIPT

FAKE_RAY = """#!/usr/bin/env bash
case " $* " in *" --head "*) sleep "${HEAD_S:-0}" ;; esac
echo "Ray runtime started."
trap "exit 0" TERM
while :; do sleep 0.1; done
"""
# `python -c '... ray.init ...'` is the script's count of alive nodes; everything else runs for real
FAKE_PYTHON = f"""#!/usr/bin/env bash
case "$2" in *ray.init*) echo "$ALIVE"; exit 0 ;; esac
exec {sys.executable} "$@"
"""


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in (("ray", FAKE_RAY), ("python", FAKE_PYTHON)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def run(fake_bin: Path, state: Path, command: str, alive: int, head_s: float = 0) -> subprocess.CompletedProcess:
    """The script's `command` with stand-in nodes (the head taking `head_s` to start) of which `alive` join."""
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "ALIVE": str(alive), "HEAD_S": str(head_s)}
    argv = [*SCRIPT, command, "--dir", str(state), "--workers", "2", "--port", "6391", "--dashboard-port", "8276"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def state(fake_bin: Path) -> Iterator[Path]:
    """The cluster's folder (short: the script refuses folders too long for Ray's sockets), its stand-in
    nodes stopped and the folder removed at the end."""
    folder = Path(f"/tmp/dsc-start-{os.getpid()}")
    yield folder
    run(fake_bin, folder, "stop", alive=0)
    shutil.rmtree(folder, ignore_errors=True)


def test_start_says_each_step_and_its_log_then_where_the_cluster_is(fake_bin, state):
    done = run(fake_bin, state, "start", alive=3)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        f"starting the head node (GCS 127.0.0.1:6391, dashboard 127.0.0.1:8276); its log: {state}/head.log",
        f"starting worker node 1 of 2; its log: {state}/worker-1.log",
        f"starting worker node 2 of 2; its log: {state}/worker-2.log",
        "checking that all 3 nodes have joined",
    ]
    assert lines[4].startswith("local Ray cluster up: 1 head + 2 workers, 2 CPUs each, dashboard at ")
    assert lines[4].endswith(" s). To use it:") and "http://127.0.0.1:8276 (" in lines[4]
    assert "export RAY_ADDRESS=http://127.0.0.1:8276" in lines[5:]
    assert (state / "head.log").read_text() == "Ray runtime started.\n"  # what `ray start` says goes there


def test_a_node_missing_from_the_cluster_is_said_after_the_steps(fake_bin, state):
    done = run(fake_bin, state, "start", alive=2)
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "checking that all 3 nodes have joined"
    assert done.stderr.startswith(f"only 2 of 3 Ray nodes are alive (see {state}/*.log); stopping.")


def test_a_node_slow_to_start_is_said_to_be_starting_before_10_s_pass_in_silence(fake_bin, state):
    done = run(fake_bin, state, "start", alive=3, head_s=10)
    assert done.returncode == 0, done.stdout + done.stderr
    head, still, worker = done.stdout.splitlines()[:3]
    assert (
        head.startswith("starting the head node")
        and worker == f"starting worker node 1 of 2; its log: {state}/worker-1.log"
    )
    assert still.startswith("  still starting after ") and still.endswith(f" s (see {state}/head.log)")
