"""`ray job submit` of every jobs/ entry point, and `dscore submit`, to the local multi-process cluster of
cluster/local_cluster.sh.

The session's one cluster (conftest's `local_ray_cluster`: a head and two worker processes on loopback, 2 CPUs
each, token auth on: docs/ray.md's recipe, where no node can hold a 4-CPU actor) serves all the submissions
of this module and faults/test_kills.py's killed node. The restart test runs last of all: it stops the
cluster and starts it again in the same folder under a terminal that closes; the fixture stops it at the
end and checks that only its own processes were ended.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
from distributed_scoring.io import schema as S
from distributed_scoring.workflows.audit.verdicts import EXIT_OK, EXIT_REGRESSION
from distributed_scoring.workflows.score import score

from helpers import rescoring as H
from helpers import tiny
from helpers.local_cluster import REPO, SCRIPT, node_pids, running

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(local_ray_cluster):
    """Environment for `ray job submit` against the session's local cluster."""
    return local_ray_cluster[0]


def dscore_submit(env: dict, *entrypoint: str) -> subprocess.CompletedProcess:
    """`dscore submit --working-dir REPO -- ENTRYPOINT` against the cluster that `env` points at."""
    return subprocess.run(
        [sys.executable, "-m", "distributed_scoring.cli", "submit", "--working-dir", str(REPO), "--", *entrypoint],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=400,
    )


def submit(env: dict, job: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["ray", "job", "submit", "--working-dir", str(REPO), "--", "python", f"jobs/{job}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    return done


def test_score_corpus_job_scores_like_the_in_process_path(cluster, tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n\n")
    model, out = str(tiny_model_dir("roberta")), tmp_path / "job-out"
    submit(
        cluster, "score_corpus.py", "--input", str(corpus), "--model", model, "--output", str(out), "--shard-rows", "4"
    )
    local = tmp_path / "local"
    score(RunConfig(InputSpec((str(corpus),), shard_rows=4), ModelSpec(model), output=str(local)))
    job = {r[S.ID]: r for r in pq.read_table(out / "rows").to_pylist()}
    expected = {r[S.ID]: r for r in pq.read_table(local / "rows").to_pylist()}
    assert job.keys() == expected.keys() and len(job) == len(tiny.CORPUS) + 1
    for key, row in expected.items():
        assert job[key][S.STATUS] == row[S.STATUS]
        if row[S.STATUS] == "ok":
            assert job[key][S.PLL] == pytest.approx(row[S.PLL], abs=1e-5)


def test_a_relative_output_is_refused_in_a_job(cluster, tmp_path, tiny_model_dir):
    """Through `dscore job`, which the jobs/ scripts run too."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    done = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            "--working-dir",
            str(REPO),
            "--",
            "python",
            "-m",
            "distributed_scoring.cli",
            "job",
            "score",
            "--input",
            str(corpus),
            "--model",
            str(tiny_model_dir("bert")),
            "--output",
            "out/relative",
        ],
        env=cluster,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode != 0 and "is relative" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_driver_joins_the_cluster_after_eval_env(cluster, tmp_path, tiny_model_dir):
    """After `eval "$(local_cluster.sh env)"`, RAY_ADDRESS is the job server's http:// address and
    DSCORE_RAY_ADDRESS the GCS one: `dscore score --ray` joins the cluster with the latter."""
    assert cluster["RAY_ADDRESS"].startswith("http://") and cluster["DSCORE_RAY_ADDRESS"].startswith("127.0.0.1:")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "distributed_scoring.cli",
            "score",
            str(corpus),
            "--model",
            str(tiny_model_dir("bert")),
            "--output",
            str(tmp_path / "out"),
            "--ray",
            "--shard-rows",
            "5",
        ],
        env={**cluster, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["rows"] == len(tiny.CORPUS)
    assert "scoring actors x 2 CPU (" in done.stderr  # planned for 2-CPU nodes


def test_rescore_audit_and_joints_jobs(cluster, tmp_path, tiny_model_dir):
    model = str(tiny_model_dir("bert"))
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(5, 4, seed=seed, prefix=split)
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    submit(
        cluster,
        "rescore_nbest.py",
        "--dev",
        str(tmp_path / "dev.jsonl"),
        "--test",
        str(tmp_path / "test.jsonl"),
        "--model",
        model,
        "--output",
        str(tmp_path / "rescored"),
    )
    report = json.loads((tmp_path / "rescored" / "report.json").read_text())
    assert {"baseline", "rescored", "oracle"} <= set(report["test"])

    corpus = tmp_path / "news.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    submit(cluster, "pppl_audit.py", "--input", str(corpus), "--model", model, "--output", str(tmp_path / "audit"))
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert audit["overall"]["rows"] == len(tiny.CORPUS) and set(audit["partitions"]) == {"news.txt"}
    assert (tmp_path / "audit" / "report.html").exists()

    submit(
        cluster,
        "pairwise_joints.py",
        "--input",
        str(corpus),
        "--model",
        model,
        "--output",
        str(tmp_path / "joints"),
        "--examples",
        "3",
        "--scheme",
        "contiguous",
    )
    report = json.loads((tmp_path / "joints" / "report.json").read_text())
    assert set(report) == {"contiguous"} and set(report["contiguous"]) == {"MLM", "MRF", "MRF-L", "HCB", "AG"}


def test_infill_sample_generate_and_train_jobs(cluster, tmp_path, tiny_model_dir):
    """The other entry points: masked spans filled and sampled, sequences generated, and a maskless student
    trained on the cluster's Ray Train workers (one per worker node) from a teacher scored in a job."""
    model = str(tiny_model_dir("bert"))
    masked = tmp_path / "masked.jsonl"
    masked.write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n"
            for i, t in (("a", "the quick [MASK] fox [MASK] over the lazy dog"), ("b", "she sells [MASK] by the sea"))
        )
    )
    submit(
        cluster,
        "infill.py",
        "--input",
        str(masked),
        "--id-column",
        "id",
        "--model",
        model,
        "--beam",
        "2",
        "--output",
        str(tmp_path / "infill"),
    )
    assert {r[S.ID]: r[S.STATUS] for r in pq.read_table(tmp_path / "infill" / "rows").to_pylist()} == {
        "a": "ok",
        "b": "ok",
    }
    submit(
        cluster,
        "sample.py",
        "--input",
        str(masked),
        "--id-column",
        "id",
        "--model",
        model,
        "--epochs",
        "2",
        "--chains",
        "2",
        "--output",
        str(tmp_path / "sample"),
    )
    assert pq.read_table(tmp_path / "sample" / "rows").num_rows == 2 * 2 * 2  # rows x chains x epochs
    submit(
        cluster,
        "generate.py",
        "--model",
        model,
        "--length",
        "5",
        "--num-sequences",
        "3",
        "--output",
        str(tmp_path / "generate"),
    )
    generated = pq.read_table(tmp_path / "generate" / "rows").to_pylist()
    assert len(generated) == 3 and all(r[S.STATUS] == "ok" and r["n_tokens"] == 5 for r in generated)

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS * 3) + "\n")
    submit(
        cluster,
        "score_corpus.py",
        "--input",
        str(corpus),
        "--model",
        model,
        "--per-token",
        "--conditionals",
        "1000",
        "--output",
        str(tmp_path / "teacher"),
    )  # the default student (distribution) needs the conditionals
    done = submit(
        cluster,
        "train.py",
        "maskless",
        "--teacher",
        str(tmp_path / "teacher"),
        "--model",
        model,
        "--output",
        str(tmp_path / "student"),
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        "--batch-size",
        "4",
        "--num-workers",
        "2",
        "--cpus-per-worker",
        "1",
        "--heldout",
        "0.25",
    )
    report = json.loads((tmp_path / "student" / "report.json").read_text())
    assert report["training"]["steps"] == 6 and "maskless step 6/6" in done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "student" / "checkpoints").glob("step-*")) == [
        "step-00000003",
        "step-00000006",
    ]


def test_dscore_submit_exits_with_the_audits_regression_code(cluster, tmp_path, tiny_model_dir):
    """A nightly audit whose snapshot regressed (many rows turned to error rows since the baseline) exits 3
    through `dscore submit`, where `ray job submit` exits 1; the job's log comes to standard output."""
    model = str(tiny_model_dir("bert"))
    day1, day2 = tmp_path / "day1" / "news.txt", tmp_path / "day2" / "news.txt"
    for path, lines in ((day1, tiny.CORPUS * 2), (day2, tiny.CORPUS * 2 + [""] * len(tiny.CORPUS) * 2)):
        path.parent.mkdir()
        path.write_text("\n".join(lines) + "\n")
    assert main(["audit", str(day1), "--model", model, "--output", str(tmp_path / "audit1")]) == EXIT_OK
    done = dscore_submit(
        cluster,
        "python",
        "jobs/pppl_audit.py",
        "--input",
        str(day2),
        "--model",
        model,
        "--output",
        str(tmp_path / "audit2"),
        "--baseline",
        str(tmp_path / "audit1"),
    )
    assert done.returncode == EXIT_REGRESSION, done.stdout[-3000:] + done.stderr[-3000:]
    audit = json.loads((tmp_path / "audit2" / "audit.json").read_text())
    assert audit["baseline"]["overall"]["status"] == "regression"
    assert '"exit_code": 3' in done.stdout and "entrypoint exited with 3" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    # Ray's packaging messages (13 lines, each 3 times, before) went to the submit log, not to the terminal; the
    # job submitted, the log is removed and not pointed to (it is only on a failed submission)
    assert "packaging.py" not in done.stderr and "Ray's messages while submitting are in" not in done.stderr
    # a line before each wait (the upload, the job's start: 13 s in silence, before); Ray's `WebSocket closed`
    # at the log's end went to that log too
    assert "packing and uploading" in done.stderr and "waiting for the cluster to start it" in done.stderr
    assert "WebSocket closed" not in done.stdout + done.stderr


def test_dscore_submit_exits_2_for_a_bad_option(cluster, tmp_path):
    done = dscore_submit(
        cluster,
        "python",
        "jobs/pppl_audit.py",
        "--input",
        str(tmp_path / "x.txt"),
        "--model",
        "m",
        "--output",
        str(tmp_path / "out"),
        "--no-such-option",
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "unrecognized arguments: --no-such-option" in done.stdout


def _submitted_sleeper(env: dict) -> subprocess.Popen:
    """`dscore submit` of a job that prints a line, then sleeps; returned once the job's log is coming."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed_scoring.cli",
            "submit",
            "--",
            "python",
            "-c",
            "import time; print('sleeping', flush=True); time.sleep(300)",
        ],
        env={**env, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert any(line.strip() == "sleeping" for line in proc.stdout)  # after the job server's own lines
    return proc


def _job_id(stderr: str) -> str:
    return next(word for word in stderr.split() if word.startswith("raysubmit_"))


def _job_status(env: dict, job: str) -> str:
    done = subprocess.run(["ray", "job", "status", job], env=env, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def test_dscore_submit_detaches_on_a_signal_and_reports_a_job_stopped_on_the_cluster(cluster):
    """Ctrl-C (no terminal to ask: detach) leaves the job running and says how to follow or stop it; a job
    stopped with `ray job stop` is reported as stopped (before: two tracebacks, and "the job server was lost")."""
    proc = _submitted_sleeper(cluster)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    job = _job_id(err)
    lines = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert lines == [
        f"dscore: stopped by SIGINT: job {job} keeps running on the cluster; follow it with `ray job logs -f {job}`, "
        f"stop it with `ray job stop {job}`"
    ], err[-3000:]
    assert "RUNNING" in _job_status(cluster, job)
    subprocess.run(["ray", "job", "stop", job], env=cluster, capture_output=True, timeout=120)

    proc = _submitted_sleeper(cluster)
    job = next(_job_id(line) for line in proc.stderr if "raysubmit_" in line)  # `dscore submit`'s log line
    stopped = subprocess.run(["ray", "job", "stop", job], env=cluster, capture_output=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    rest = proc.stderr.read()
    assert proc.wait(120) == 1, rest[-3000:]
    assert "was stopped (`ray job stop`) before it finished" in rest and "may still run" not in rest, rest[-3000:]


@pytest.mark.changes_cluster(2)
def test_the_cluster_restarts_in_its_folder_and_outlives_the_terminal_that_started_it(local_ray_cluster):
    """`stop`, then `start` again in the same folder (the old nodes' logs still there) under a pseudo-terminal
    that closes as soon as `start` returns (SIGHUP to its session, as when an `ssh -t` or a CI step ends):
    every node comes up and is still alive seconds later. Last of the cluster's tests (after the killed node
    of faults/test_kills.py, whose node it brings back): the fixture stops this one."""
    env, state = local_ray_cluster
    subprocess.run([*SCRIPT, "stop", "--dir", str(state)], env=env, check=True, timeout=120)
    assert "Ray runtime started" in (state / "head.log").read_text()  # what used to pass the start-up check
    start = [
        *SCRIPT,
        "start",
        "--dir",
        str(state),
        "--workers",
        "2",
        "--cpus",
        "2",
        "--port",
        (state / "port").read_text().strip(),
        "--dashboard-port",
        (state / "dashboard_port").read_text().strip(),
    ]
    done = subprocess.run(
        ["script", "-qec", shlex.join(start), "/dev/null"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "local Ray cluster up: 1 head + 2 workers" in done.stdout, done.stdout[-3000:]
    time.sleep(5)
    pids = node_pids(state)
    assert len(pids) == 3 and all(running(pid) for pid in pids)
    status = subprocess.run(
        [*SCRIPT, "status", "--dir", str(state)], env=env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0 and status.stdout.strip() == "3 of 3 Ray nodes alive", status.stdout + status.stderr
