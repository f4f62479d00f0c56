"""Storage that cannot be used, told in one line before any work (exit 2), against a real S3 API (moto's
server) and an endpoint where nothing listens; and a lock that cannot be released never hides the error
that ended the run.

Before: an unreachable --output, `verify` and an unreachable --baseline were tracebacks with exit 1 (the
"incomplete: rerun" code, so a scheduler retried a credentials problem), and the lock was left behind.
"""

from __future__ import annotations

import json
import time

import pytest

from distributed_scoring.io.lock import FolderLock, read_holder
from distributed_scoring.io.output import OutputDir

from cli_helpers import refusal
from object_store import free_port


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
