"""`ray job submit` of every jobs/ entry point to the local multi-process cluster of cluster/local_cluster.sh.

One cluster (a head and a worker process on loopback, token auth on) serves all the submissions of
this module; the fixture stops it and checks that only its own processes were ended.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

import rescoring_helpers as H
import tiny
from distributed_scoring import schema as S
from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
from distributed_scoring.runner import score

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


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


@pytest.fixture(scope="module")
def cluster(ray_local):
    """Environment for `ray job submit` against a freshly started local cluster."""
    # Ray's socket paths must stay under 107 bytes, so the cluster's folder is short, not under tmp_path.
    state = Path(tempfile.mkdtemp(prefix="dsc-", dir="/tmp"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    dashboard = free_port()
    script = ["bash", str(REPO / "cluster" / "local_cluster.sh")]
    subprocess.run([*script, "start", "--dir", str(state), "--workers", "1", "--cpus", "2",
                    "--port", str(free_port()), "--dashboard-port", str(dashboard)], env=env, check=True, timeout=240)
    started = [int(p) for p in (state / "pids").read_text().split()]
    try:
        yield {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(state / "auth_token"),
               "RAY_ADDRESS": f"http://127.0.0.1:{dashboard}"}
    finally:
        subprocess.run([*script, "stop", "--dir", str(state)], env=env, check=True, timeout=120)
    assert not any(running(pid) for pid in started)
    assert ray_local.get(ray_local.put("still alive")) == "still alive"  # only our cluster was stopped


def submit(env: dict, job: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(["ray", "job", "submit", "--working-dir", str(REPO), "--", "python", f"jobs/{job}", *args],
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    return done


def test_score_corpus_job_scores_like_the_in_process_path(cluster, tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n\n")
    model, out = str(tiny_model_dir("roberta")), tmp_path / "job-out"
    submit(cluster, "score_corpus.py", "--input", str(corpus), "--model", model, "--output", str(out), "--shard-rows", "4")
    local = tmp_path / "local"
    score(RunConfig(InputSpec((str(corpus),), shard_rows=4), ModelSpec(model), output=str(local)))
    job = {r[S.ID]: r for r in pq.read_table(out / "rows").to_pylist()}
    expected = {r[S.ID]: r for r in pq.read_table(local / "rows").to_pylist()}
    assert job.keys() == expected.keys() and len(job) == len(tiny.CORPUS) + 1
    for key, row in expected.items():
        assert job[key][S.STATUS] == row[S.STATUS]
        if row[S.STATUS] == "ok":
            assert job[key][S.PLL] == pytest.approx(row[S.PLL], abs=1e-5)


def test_rescore_audit_and_joints_jobs(cluster, tmp_path, tiny_model_dir):
    model = str(tiny_model_dir("bert"))
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(5, 4, seed=seed, prefix=split)
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    submit(cluster, "rescore_nbest.py", "--dev", str(tmp_path / "dev.jsonl"), "--test", str(tmp_path / "test.jsonl"),
           "--model", model, "--output", str(tmp_path / "rescored"))
    report = json.loads((tmp_path / "rescored" / "report.json").read_text())
    assert {"baseline", "rescored", "oracle"} <= set(report["test"])

    corpus = tmp_path / "news.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    submit(cluster, "pppl_audit.py", "--input", str(corpus), "--model", model, "--output", str(tmp_path / "audit"))
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert audit["overall"]["rows"] == len(tiny.CORPUS) and set(audit["partitions"]) == {"news.txt"}
    assert (tmp_path / "audit" / "report.html").exists()

    submit(cluster, "pairwise_joints.py", "--input", str(corpus), "--model", model, "--output", str(tmp_path / "joints"),
           "--examples", "3", "--scheme", "contiguous")
    report = json.loads((tmp_path / "joints" / "report.json").read_text())
    assert set(report) == {"contiguous"} and set(report["contiguous"]) == {"MLM", "MRF", "MRF-L", "HCB", "AG"}
