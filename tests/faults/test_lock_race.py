"""The run lock cannot be taken twice: processes that try to take one folder's lock at the same instant, many
times over, on local disk and on S3 (moto's server), and exactly one of them holds it each time.

Before the lock was taken with one conditional request, a folder on S3 was checked, then written: two runs
started together into one s3 folder both got in (5 of 8 tries), and the folder mixed their rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distributed_scoring.io.lock import STALE_AFTER_S, FolderLock, FolderLockedError, Holder, lock_file, read_holder
from distributed_scoring.io.output import OutputDir

PROCESSES = 4
TRIES = 20
SLOT_S = 0.25  # try k starts at start + k * SLOT_S in every process


def _wait_for(condition, limit_s: float = 240.0) -> None:
    deadline = time.time() + limit_s
    while not condition():
        assert time.time() < deadline, "the racing processes did not all get there"
        time.sleep(0.02)


def take_locks(base: str, sync: Path) -> list[bool]:
    """In one process: once every racer is ready, at each try's instant, try to take the lock of the try's own
    folder; a lock taken is held until every racer has made all its tries (so that a late try still finds it),
    and the folder is written under it."""
    (sync / f"ready-{os.getpid()}").touch()
    _wait_for(lambda: (sync / "start").exists())
    start = float((sync / "start").read_text())
    held, won = [], []
    for k in range(TRIES):
        time.sleep(max(0.0, start + k * SLOT_S - time.time()))
        out = OutputDir(f"{base}/try-{k}")
        lock = FolderLock(out, heartbeat_s=3600)
        try:
            lock.acquire()
        except FolderLockedError:
            won.append(False)
            continue
        out.write_text(f"writer-{lock.holder.token}", "written under the lock")
        held.append(lock)
        won.append(True)
    (sync / f"done-{os.getpid()}").touch()
    _wait_for(lambda: len(list(sync.glob("done-*"))) == PROCESSES)
    for lock in held:
        lock.release()
    return won


def race(base: str, sync: Path) -> list[list[bool]]:
    """`PROCESSES` processes racing for `TRIES` folders under `base`: who won each try, per process. They start
    together once all have imported what they need (`sync`: a local folder for the start and end signals)."""
    sync.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen([sys.executable, __file__, base, str(sync)], stdout=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)
    ]
    _wait_for(lambda: len(list(sync.glob("ready-*"))) == PROCESSES)
    ready = sync / "start.tmp"  # written whole, then renamed: a racer never reads the start time half written
    ready.write_text(repr(time.time() + 0.5))
    ready.rename(sync / "start")
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def check_one_winner(results: list[list[bool]], writers: list[list[str]]) -> None:
    winners = [sum(r[k] for r in results) for k in range(TRIES)]
    assert winners == [1] * TRIES, winners
    assert [len(w) for w in writers] == [1] * TRIES, writers


def test_simultaneous_starts_on_local_disk_leave_exactly_one_holder(tmp_path):
    results = race(str(tmp_path / "race"), tmp_path / "sync")
    writers = [[p.name for p in (tmp_path / "race" / f"try-{k}").glob("writer-*")] for k in range(TRIES)]
    check_one_winner(results, writers)
    assert not list(tmp_path.glob("race/try-*/_lock.json")) and not list(tmp_path.glob("race/try-*/.*tmp"))


def test_simultaneous_starts_on_s3_leave_exactly_one_holder(s3, tmp_path):
    results = race(s3.uri("race").rstrip("/"), tmp_path / "sync")
    keys = s3.keys("race/")
    writers = [[key for key in keys if key.startswith(f"race/try-{k}/writer-")] for k in range(TRIES)]
    check_one_winner(results, writers)
    assert not [key for key in keys if key.endswith("_lock.json")]  # all released


def stale_lock(out: OutputDir) -> None:
    old = time.time() - 2 * STALE_AFTER_S
    out.write_bytes("_lock.json", Holder("gpu-node-7", 4242, None, old, old, "stale").encoded())


def test_two_takers_of_a_stale_lock_on_s3_never_both_win(s3):
    """A stale lock is taken over only at the version read: the second taker's conditional request fails."""
    out = OutputDir(s3.uri("stale").rstrip("/"))
    stale_lock(out)
    seen = lock_file(out).read()[1]  # what a second taker read before the first took over
    first, second = FolderLock(out, heartbeat_s=3600), FolderLock(out, heartbeat_s=3600)
    first.acquire()
    assert read_holder(out).token == first.holder.token
    assert not lock_file(out).delete(seen)  # the second taker's delete at what it read is refused
    with pytest.raises(FolderLockedError, match="in use by another run"):
        second.acquire()
    first.release()
    assert read_holder(out) is None


def test_the_heartbeat_outlives_failed_requests_and_a_lost_lock_is_not_deleted(tmp_path, caplog):
    out = OutputDir(str(tmp_path / "out"))
    lock = FolderLock(out, heartbeat_s=0.05)
    lock.acquire()
    real = lock._file.replace
    calls = []

    def flaky(data: bytes, version: str):
        calls.append(version)
        if len(calls) <= 2:
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: Could not connect")
        return real(data, version)

    lock._file.replace = flaky
    time.sleep(0.5)
    assert len(calls) > 3 and lock._thread.is_alive()  # before: the first failure ended the thread for good
    assert read_holder(out).heartbeat > lock.holder.started
    assert "the heartbeat of" in caplog.text
    (tmp_path / "out" / "_lock.json").write_bytes(Holder("other", 1, None, 0.0, time.time(), "other").encoded())
    time.sleep(0.3)
    assert lock.lost and not lock._thread.is_alive()
    lock.release()
    assert read_holder(out).token == "other"  # another run's lock is never deleted


def test_a_store_without_conditional_requests_is_refused_unless_unsafe_lock(tmp_path, monkeypatch):
    out = OutputDir(str(tmp_path / "out"))
    out.fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # a store of another kind
    monkeypatch.delenv("DSCORE_UNSAFE_LOCK", raising=False)
    with pytest.raises(FolderLockedError, match="cannot lock a folder on subtree.*pass --unsafe-lock"):
        lock_file(out)
    monkeypatch.setenv("DSCORE_UNSAFE_LOCK", "1")
    assert type(lock_file(out)).__name__ == "UnsafeLockFile"


def test_two_score_runs_started_together_into_one_s3_folder_one_writes(s3, tiny_model_dir, tmp_path):
    """The issue's case: float32 and float64 runs into one s3 folder at the same instant. Exactly one exits
    0; the other is refused (in use, or a different run) and the folder's rows are the winner's."""
    text = tmp_path / "in.txt"
    text.write_text("".join(f"sentence number {i} here\n" for i in range(6)))
    model = str(tiny_model_dir("bert"))
    output = s3.uri("nightly/out").rstrip("/")
    base = [str(Path(sys.executable).with_name("dscore")), "score", str(text), "--model", model]
    runs = {
        dtype: subprocess.Popen(
            [*base, "--output", output, "--dtype", dtype, "--shard-rows", "2"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for dtype in ("float32", "float64")
    }
    codes = {dtype: (proc.wait(300), proc.stderr.read()) for dtype, proc in runs.items()}
    assert sorted(code for code, _ in codes.values()) == [0, 2], codes
    winner = next(dtype for dtype, (code, _) in codes.items() if code == 0)
    loser_err = next(err for code, err in codes.values() if code == 2)
    assert "Traceback" not in loser_err and ("in use by another run" in loser_err or "different run" in loser_err)
    run = json.loads(s3.get("nightly/out/_run.json"))
    assert run["dtype"] == winner
    assert pq.read_table(s3.uri("nightly/out/rows/")).num_rows == 6


if __name__ == "__main__":
    print(json.dumps(take_locks(sys.argv[1], Path(sys.argv[2]))))
    sys.exit(0)
