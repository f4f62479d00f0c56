"""benchmarks/harness.py: the journal that makes a long benchmark resumable, and killing a measurement's
whole process tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import harness  # noqa: E402


def record(key: str, status: str, timeout_s: float = 60.0) -> dict:
    return {"key": key, "status": status, "timeout_s": timeout_s}


def test_journal_skips_what_finished_and_reruns_what_did_not(tmp_path):
    journal = tmp_path / "scale.jsonl"
    for rec in (
        record("done", "ok"),
        record("slow", "timeout", 60.0),
        record("broken", "failed"),
        record("skipped", "skipped"),
    ):
        harness.append_journal(journal, rec)
    with journal.open("a") as f:
        f.write('{"key": "cut off')  # a run killed while writing its line
    records = harness.load_journal(journal)
    assert set(records) == {"done", "slow", "broken", "skipped"}
    assert harness.is_finished(records["done"], 60.0)
    assert harness.is_finished(records["slow"], 60.0) and not harness.is_finished(records["slow"], 120.0)
    assert not harness.is_finished(records["broken"], 60.0) and not harness.is_finished(records["skipped"], 60.0)
    assert not harness.is_finished(None, 60.0)


def test_kill_tree_kills_descendants_in_other_sessions(tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
        f"open({str(pids)!r}, 'w').write(str(c.pid)); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    for _ in range(300):
        if pids.exists() and pids.read_text():
            break
        time.sleep(0.05)
    child = int(pids.read_text())
    harness.kill_tree(parent.pid)
    parent.wait(timeout=30)
    for pid in (parent.pid, child):
        assert gone(pid), pid


def gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie whose parent has not reaped it)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
