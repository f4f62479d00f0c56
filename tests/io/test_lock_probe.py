"""Stores proven, not trusted: before its first lock on an S3 endpoint, a run checks that the store keeps each
condition the lock relies on (a create twice, a replace and a delete at a stale ETag, on a probe object of its
own beside the lock), and refuses, in one line naming --unsafe-lock, a store that does not.

Before, the lock trusted any endpoint: behind a proxy that drops `If-None-Match`/`If-Match`, 4 of 4 processes
held one folder in 20 of 20 tries, and the same command started twice resumed beside itself, both exiting 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distributed_scoring.config import UNSAFE_LOCK_ENV
from distributed_scoring.io import lock as lock_module
from distributed_scoring.io.lock import FolderLock, UnsafeStoreError, read_holder
from distributed_scoring.io.output import OutputDir

from helpers.s3_proxy import CONDITIONS, CountingProxy, conditional_delete


@pytest.fixture
def unsafe_store(s3, moto_server, monkeypatch):
    """A proxy in front of moto's S3 server that removes the conditional headers, found through
    AWS_ENDPOINT_URL: a store that ignores them. moto alone: it does not check signatures, which a store that
    does (SeaweedFS) finds broken once a signed header is removed."""
    stripping = CountingProxy(moto_server.endpoint, strip=CONDITIONS).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", stripping.endpoint)
    monkeypatch.delenv(UNSAFE_LOCK_ENV, raising=False)
    yield stripping
    stripping.stop()


def probes(s3, prefix: str = "") -> list[str]:
    return [key for key in s3.keys(prefix) if "_lock.probe-" in key]


def test_the_store_is_proven_once_per_endpoint_and_the_probe_is_removed(proxy, s3):
    first = OutputDir(s3.uri("a").rstrip("/"))
    before = len(proxy.requests())
    with FolderLock(first, heartbeat_s=3600):
        sent = proxy.requests()[before:]
    probe_requests = [r for r in sent if "_lock.probe-" in r]
    assert len(probe_requests) >= 5, sent  # create, create again, replace and delete at a stale ETag, delete
    assert not probes(s3) and read_holder(first) is None
    before = len(proxy.requests())
    with FolderLock(OutputDir(s3.uri("b").rstrip("/")), heartbeat_s=3600):
        pass
    assert not [r for r in proxy.requests()[before:] if "_lock.probe-" in r]  # the verdict is kept


def test_a_store_that_ignores_the_conditions_is_refused_in_one_line(unsafe_store, s3):
    out = OutputDir(s3.uri("out").rstrip("/"))
    with pytest.raises(UnsafeStoreError) as refused:
        FolderLock(out, heartbeat_s=3600).acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert "ignores If-None-Match" in message and unsafe_store.endpoint in message
    assert "--unsafe-lock" in message and f"{UNSAFE_LOCK_ENV}=1" in message
    assert not s3.keys("out/")  # neither the lock nor the probe is left


def test_unsafe_lock_takes_a_check_then_write_lock_there(unsafe_store, s3, monkeypatch, caplog):
    monkeypatch.setenv(UNSAFE_LOCK_ENV, "1")
    out = OutputDir(s3.uri("out").rstrip("/"))
    with FolderLock(out, heartbeat_s=3600) as held:
        assert type(held._file).__name__ == "UnsafeLockFile"
        assert read_holder(out).token == held.holder.token
    assert "cannot hold the lock" in caplog.text and "--unsafe-lock" in caplog.text
    assert not [key for key in s3.keys("out/") if key != "out/"]  # pyarrow may leave the empty folder's marker


def test_a_store_that_does_not_take_a_conditional_delete_is_refused(s3, s3_server, monkeypatch):
    """LocalStack answers 501 to a DELETE with If-Match: the lock could be taken, never released (on moto and
    SeaweedFS alike: the proxy answers that request itself)."""
    localstack = CountingProxy(s3_server.endpoint, not_implemented=conditional_delete).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", localstack.endpoint)
    monkeypatch.delenv(UNSAFE_LOCK_ENV, raising=False)
    try:
        with pytest.raises(UnsafeStoreError, match="does not take a conditional request.*--unsafe-lock"):
            FolderLock(OutputDir(s3.uri("out").rstrip("/")), heartbeat_s=3600).acquire()
    finally:
        localstack.stop()
    assert not s3.keys("out/")


def test_the_verdict_is_per_endpoint(unsafe_store, s3, monkeypatch):
    """The same process still locks through an endpoint that keeps the conditions after one was refused."""
    with pytest.raises(UnsafeStoreError):
        FolderLock(OutputDir(s3.uri("x").rstrip("/")), heartbeat_s=3600).acquire()
    assert unsafe_store.endpoint in lock_module._proven
    honest = CountingProxy(unsafe_store.upstream.geturl()).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", honest.endpoint)
    try:
        with FolderLock(OutputDir(s3.uri("y").rstrip("/")), heartbeat_s=3600):
            pass
    finally:
        honest.stop()
    assert lock_module._proven[honest.endpoint] is None


def test_dscore_score_behind_the_stripping_proxy_exits_2_naming_unsafe_lock(unsafe_store, s3, tiny_model_dir, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("".join(f"sentence number {i} here\n" for i in range(4)))
    dscore = str(Path(sys.executable).with_name("dscore"))
    args = [dscore, "score", str(text), "--model", str(tiny_model_dir("bert")), "--output", s3.uri("out")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("dscore: error:")]
    assert len(lines) == 1 and "--unsafe-lock" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not s3.keys("out/")
