"""Kills mid-run: a scoring actor, the driver (with its embedded Ray), a worker node of a local cluster.
After each, rows in == rows out with each id once, and shards finished before the kill are kept."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig
from distributed_scoring.io import schema as S
from distributed_scoring.workflows.score import score

from helpers.driver import embedded_env, make_corpus, why
from helpers.local_cluster import REPO, node_pids, running, wait_for_alive_nodes

pytestmark = pytest.mark.ray
STALL_S = 120  # a run that stops making progress fails within this, instead of hanging the suite
RAY = RayOptions(stall_timeout_s=STALL_S)


def markers(out: Path) -> dict[str, int]:
    """Finished shards: marker name -> mtime of the marker and of its shard file (summed: either changing shows)."""
    done = sorted((out / "_done").glob("*.json")) if (out / "_done").exists() else []
    return {m.name: m.stat().st_mtime_ns + (out / "rows" / f"part-{m.stem}.parquet").stat().st_mtime_ns for m in done}


def check_each_id_once(out: Path, n_lines: int) -> None:
    ids = Counter(pq.read_table(out / "rows", columns=[S.ID]).column(S.ID).to_pylist())
    assert set(ids) == {f"many.txt:{i}" for i in range(1, n_lines + 1)}, "rows lost or foreign ids"
    assert set(ids.values()) == {1}, f"ids written twice: {[k for k, v in ids.items() if v > 1][:5]}"
    assert not list((out / "rows").glob(".*.tmp"))


def wait_for_markers(out: Path, at_least: int, proc: subprocess.Popen, limit_s: float = 180) -> None:
    deadline = time.time() + limit_s
    while len(markers(out)) < at_least and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)


def cli(corpus: str, model: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "distributed_scoring.cli",
        "score",
        corpus,
        "--model",
        model,
        "--output",
        str(out),
        "--ray",
        "--shard-rows",
        "2",
        "--stall-timeout",
        str(STALL_S),
    ]


def _kill_scoring_actor_when(out: Path, min_done: int, killed: list) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and not killed:
        if len(markers(out)) >= min_done:
            for proc in psutil.process_iter(["cmdline"]):
                if "ScoreStage" in " ".join(proc.info["cmdline"] or []):
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
        time.sleep(0.05)


def test_a_killed_scoring_actor_is_replaced_and_no_row_is_lost_or_doubled(ray_local, tmp_path, tiny_model_dir):
    corpus = make_corpus(tmp_path / "in", 120)
    out = tmp_path / "out"
    config = RunConfig(InputSpec((corpus,), shard_rows=2), ModelSpec(str(tiny_model_dir("bert"))), output=str(out))
    killed: list[int] = []
    killer = threading.Thread(target=_kill_scoring_actor_when, args=(out, 3, killed))
    killer.start()
    summary = score(config, RAY)
    killer.join()
    assert killed, "the scoring actor was never found and killed"
    assert len(markers(out)) == 60
    check_each_id_once(out, 120)
    assert summary["rows"] == summary["rows_expected"] == 120 and summary["ok"] == 120


def test_a_rerun_after_a_killed_driver_scores_only_unfinished_shards(tmp_path, tiny_model_dir):
    corpus, out = make_corpus(tmp_path / "in", 160), tmp_path / "out"
    command = cli(corpus, str(tiny_model_dir("bert")), out)
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(command, start_new_session=True, env=embedded_env(), stdout=log, stderr=log)
    family: list[psutil.Process] = []
    try:
        wait_for_markers(out, 3, driver)
        family = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
        driver.send_signal(signal.SIGKILL)  # the driver alone, as `kill -9 PID` or the OOM killer does
        driver.wait()
        # The embedded Ray's GCS, raylet and workers go with it; its DashboardAgent and RuntimeEnvAgent
        # stayed a minute (waiting on the dead GCS) until the driver's watchdog ended them.
        left = [p for p in psutil.wait_procs(family, timeout=30)[1] if running(p.pid)]
        assert not left, f"processes of the killed driver's Ray outlived it: {[p.name() for p in left]}"
    finally:
        for proc in family:
            if running(proc.pid):
                proc.kill()
    finished = markers(out)
    assert 3 <= len(finished) < 80, f"{len(finished)} of 80 shards done when the driver was killed"

    rerun = subprocess.run(command, env=embedded_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, why(rerun.stderr)
    assert json.loads(rerun.stdout)["rows"] == 160
    after = markers(out)
    assert len(after) == 80 and {name: after[name] for name in finished} == finished  # finished shards not redone
    check_each_id_once(out, 160)


def raylet_of(node_pid: int) -> psutil.Process:
    return next(p for p in psutil.Process(node_pid).children(recursive=True) if p.name() == "raylet")


def node_holding_a_scorer(workers: list[int]) -> int:
    """Two 2-CPU scoring actors on three 2-CPU nodes: at least one worker node holds one."""
    for pid in workers:
        if any("ScoreStage" in " ".join(p.cmdline()) for p in psutil.Process(pid).children(recursive=True)):
            return pid
    raise AssertionError("no worker node holds a scoring actor")


@pytest.mark.changes_cluster(1)
def test_a_killed_worker_node_loses_no_row_and_doubles_none(local_ray_cluster, tmp_path, tiny_model_dir):
    """The session's cluster, head and two workers of 2 CPUs: two scoring actors, one node spare. The worker
    node that holds a scoring actor loses its raylet mid-run (and with it every process on that node). The run
    either finishes on the nodes left, or stops and a rerun finishes; either way each id is written once.
    Runs after the tests that need every node (conftest's `cluster_rank`); the cluster's restart test follows."""
    corpus, out = make_corpus(tmp_path / "in", 120), tmp_path / "out"
    command = cli(corpus, str(tiny_model_dir("bert")), out)
    env, state = local_ray_cluster
    env = {**env, "PYTHONPATH": str(REPO)}
    log = (tmp_path / "driver.log").open("w")
    driver = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        wait_for_markers(out, 3, driver)
        assert driver.poll() is None, "the run ended before a node could be killed"
        victim = node_holding_a_scorer(node_pids(state)[1:])
        raylet_of(victim).kill()
        finished = markers(out)
        first = driver.wait(timeout=STALL_S + 120)
    finally:
        if driver.poll() is None:
            driver.kill()
    if first != 0:  # rerun as an operator would, once Ray has seen the node go
        wait_for_alive_nodes(env, state, alive=2)
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, why(rerun.stderr)
    after = markers(out)
    assert len(after) == 60 and {name: after[name] for name in finished} == finished
    check_each_id_once(out, 120)
