"""`ray job submit` of jobs/score_corpus.py to the local multi-process cluster of cluster/local_cluster.sh."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from distributed_scoring import schema as S
from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
from distributed_scoring.runner import score

import tiny

REPO = Path(__file__).resolve().parents[1]


def running(pid: int) -> bool:
    """Alive and not a zombie (this machine's init reaps orphans late)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
def test_submitted_job_scores_like_the_in_process_path(ray_local, tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n\n")
    model = str(tiny_model_dir("roberta"))
    # Ray's socket paths must stay under 107 bytes, so the cluster's folder is short, not under tmp_path.
    state, out = Path(tempfile.mkdtemp(prefix="dsc-", dir="/tmp")), tmp_path / "job-out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    dashboard = free_port()
    script = ["bash", str(REPO / "cluster" / "local_cluster.sh")]
    subprocess.run([*script, "start", "--dir", str(state), "--workers", "1", "--cpus", "2",
                    "--port", str(free_port()), "--dashboard-port", str(dashboard)], env=env, check=True, timeout=240)
    started = [int(p) for p in (state / "pids").read_text().split()]
    try:
        job_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(state / "auth_token"),
                   "RAY_ADDRESS": f"http://127.0.0.1:{dashboard}"}
        submitted = subprocess.run(
            ["ray", "job", "submit", "--working-dir", str(REPO), "--", "python", "jobs/score_corpus.py",
             "--input", str(corpus), "--model", model, "--output", str(out), "--shard-rows", "4"],
            env=job_env, capture_output=True, text=True, timeout=400,
        )
        assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
        assert "succeeded" in submitted.stdout + submitted.stderr
    finally:
        subprocess.run([*script, "stop", "--dir", str(state)], env=env, check=True, timeout=120)
    assert not any(running(pid) for pid in started)
    assert ray_local.get(ray_local.put("still alive")) == "still alive"  # only our cluster was stopped

    local = tmp_path / "local"
    score(RunConfig(InputSpec((str(corpus),), shard_rows=4), ModelSpec(model), output=str(local)))
    job = {r[S.ID]: r for r in pq.read_table(out / "rows").to_pylist()}
    expected = {r[S.ID]: r for r in pq.read_table(local / "rows").to_pylist()}
    assert job.keys() == expected.keys() and len(job) == len(tiny.CORPUS) + 1
    for key, row in expected.items():
        assert job[key][S.STATUS] == row[S.STATUS]
        if row[S.STATUS] == "ok":
            assert job[key][S.PLL] == pytest.approx(row[S.PLL], abs=1e-5)
