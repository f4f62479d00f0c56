"""`cluster/local_cluster.sh stop` says what it waits for, then how long it took: each `ray start --block`
node drains on SIGTERM (30 s by Ray's default) before it ends, which once made `stop` silent for 33 s. Its
nodes here are stand-ins, shell loops that take a second to end on SIGTERM, so no Ray starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.local_cluster import SCRIPT, running

NODE = 'trap "sleep 1; exit 0" TERM; while :; do sleep 0.1; done'


@pytest.fixture
def nodes(tmp_path):
    """A cluster folder whose `pids` are two stand-in nodes (ended at the latest at the test's end)."""
    started = [subprocess.Popen(["bash", "-c", NODE]) for _ in range(2)]
    (tmp_path / "pids").write_text("".join(f"{p.pid}\n" for p in started))
    yield tmp_path, started
    for process in started:
        process.kill()
        process.wait()


def stop(folder: Path) -> list[str]:
    done = subprocess.run([*SCRIPT, "stop", "--dir", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_stop_says_a_node_may_drain_for_ray_s_30_s_then_how_long_it_took(nodes):
    """A cluster started without `drain_s` (before the script kept it) drains for Ray's default."""
    folder, started = nodes
    before, after = stop(folder)
    assert before == (
        f"stopping the 2 Ray nodes started from {folder}: each drains first (Ray's graceful shutdown), for up to 30 s"
    )
    assert after.startswith(f"stopped the cluster started from {folder} (") and after.endswith(" s)")
    assert not any(running(p.pid) for p in started) and not (folder / "pids").exists()


def test_stop_of_nodes_started_without_a_drain_says_no_drain(nodes):
    folder, _ = nodes
    (folder / "drain_s").write_text("0\n")  # as `start` writes it by default
    before, after = stop(folder)
    assert before == f"stopping the 2 Ray nodes started from {folder}"
    assert after.startswith(f"stopped the cluster started from {folder} (")
