"""Storage that cannot be used, told in one line before any work (exit 2), against a real S3 API (moto's
server) and an endpoint where nothing listens; and a lock that cannot be released never hides the error
that ended the run.

Before: an unreachable --output, `verify` and an unreachable --baseline were tracebacks with exit 1 (the
"incomplete: rerun" code, so a scheduler retried a credentials problem), and the lock was left behind.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_scoring.io.lock import FolderLock, read_holder
from distributed_scoring.io.output import OutputDir

from helpers.cli import refusal
from helpers.object_store import free_port


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("the cat sat\non the mat\n")
    return str(path)


@pytest.fixture
def unreachable(s3, monkeypatch):
    """The test's bucket, with AWS_ENDPOINT_URL pointing where nothing listens."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    return s3


def score_args(corpus: str, model: str, output: str) -> list[str]:
    return ["score", corpus, "--model", model, "--output", output]


def test_an_unreachable_output_is_one_line_before_any_work(unreachable, corpus, tiny_model_dir, capsys):
    line = refusal(capsys, score_args(corpus, str(tiny_model_dir("bert")), unreachable.uri("out")))
    assert unreachable.uri("out") in line and "endpoint is unreachable" in line and "AWS_ENDPOINT_URL" in line


def test_an_output_in_a_missing_bucket_is_one_line(s3, corpus, tiny_model_dir, capsys):
    line = refusal(capsys, score_args(corpus, str(tiny_model_dir("bert")), "s3://no-such-bucket-here/out"))
    assert "s3://no-such-bucket-here/out" in line and "the bucket does not exist" in line


def test_verify_on_an_unreachable_store_is_one_line(unreachable, capsys):
    line = refusal(capsys, ["verify", unreachable.uri("out")])
    assert "endpoint is unreachable" in line


def test_an_unreachable_baseline_is_one_line_before_any_scoring(unreachable, corpus, tiny_model_dir, tmp_path, capsys):
    args = [
        "audit",
        corpus,
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(tmp_path / "audit"),
        "--baseline",
        unreachable.uri("audits/yesterday/audit.json"),
    ]
    line = refusal(capsys, args)
    assert "baseline" in line and "endpoint is unreachable" in line
    assert not (tmp_path / "audit").exists()  # refused before the folder was claimed


def test_a_lock_that_cannot_be_released_is_named_not_raised(s3, caplog):
    """An outage through clean-up: the release logs the lock and what to do; the run's own error stays the one
    told (before: `Cannot delete file .../_lock.json` raised over it)."""
    out = OutputDir(s3.uri("out").rstrip("/"))

    def outage(version: str) -> bool:
        raise OSError("AWS Error NETWORK_CONNECTION during DeleteObject operation: Could not connect to server")

    with pytest.raises(RuntimeError, match="the run's own error"):
        with FolderLock(out, heartbeat_s=3600) as lock:
            lock._file.delete = outage
            raise RuntimeError("the run's own error")
    assert "could not delete the lock" in caplog.text and "takes it over once its heartbeat is 600 s old" in caplog.text
    holder = read_holder(out)
    assert holder is not None and json.loads(s3.get("out/_lock.json"))["token"] == holder.token
    assert holder.heartbeat <= time.time()


def test_a_path_part_too_long_is_one_line(corpus, tiny_model_dir, tmp_path, capsys):
    """Before: a traceback, exit 1 (the clean-up stat()ed the bad path again while handling the first error)."""
    line = refusal(capsys, score_args(corpus, str(tiny_model_dir("bert")), str(tmp_path / ("a" * 300))))
    assert "a name in the path is longer than the filesystem allows" in line


def test_too_few_open_files_for_ray_is_one_line_before_ray_starts(corpus, tiny_model_dir, tmp_path):
    """Before, with `ulimit -n 64`: 45 lines of raylet dump and "incomplete ... rerun" (exit 1)."""
    out = tmp_path / "out"
    argv = [str(Path(sys.executable).with_name("dscore")), *score_args(corpus, str(tiny_model_dir("bert")), str(out))]
    done = subprocess.run(
        [*argv, "--ray"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("dscore: ")]
    assert done.returncode == 2 and len(lines) == 1 and "the open-files limit is 64 (ulimit -n)" in lines[0], (
        done.stderr
    )
    assert "Traceback" not in done.stderr and not out.exists()
