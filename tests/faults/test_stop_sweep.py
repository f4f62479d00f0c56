"""A stop at any instant of a run: SIGTERM to the driver's process group swept across an audit's phases
(before the claim, at the lock's creation, mid-shard, at the last marker, while row_stats.parquet, audit.json
and report.html are written), each followed by `verify` (INCOMPLETE, or no folder when the stop came before
the claim: never OK, never FAILED) and a rerun of the same command to OK; and the instant the lock file is
created, which a signal could cut in two.

Before: a signal just after `_lock.json` was created left it (3 of 6 tries) and `verify` said "not a dscore
output folder"; stopped before report.html, `verify` said OK; stopped while row_stats.parquet was written,
FAILED (damaged) where the run was only incomplete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_scoring import stopping
from distributed_scoring.io import lock as lock_module
from distributed_scoring.io.lock import LOCK_FILE, FolderLock
from distributed_scoring.io.output import OutputDir
from distributed_scoring.workflows.verify import NotARunFolderError, verify_folder

from helpers import tiny
from helpers.driver import embedded_env

DSCORE = str(Path(sys.executable).with_name("dscore"))
INSTANTS = 20
STOP_S = 10.0


def test_a_signal_as_the_lock_is_created_leaves_no_lock(tmp_path, monkeypatch):
    created = lock_module.LocalLockFile.create

    def create_then_signal(self, data):
        version = created(self, data)
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler at the next instruction: here
        return version

    monkeypatch.setattr(lock_module.LocalLockFile, "create", create_then_signal)
    out = OutputDir(str(tmp_path / "out"))
    with pytest.raises(stopping.Stopped), stopping.stopping_on_signals():
        with FolderLock(out):
            pass
    assert not (tmp_path / "out" / LOCK_FILE).exists(), "the lock was left behind"


def audit_argv(folder: Path, model: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]} {i}" for i in range(60)) + "\n")
    return [DSCORE, "audit", str(corpus), "--model", str(model), "--output", str(folder / "out"), "--shard-rows", "3"]


def run(argv: list[str], after_s: float | None = None) -> tuple[int, str, float]:
    """The command, its process group sent SIGTERM `after_s` seconds after its start (None: left to finish):
    its exit code, stderr and the seconds from the signal to the exit."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=embedded_env(), start_new_session=True)
    took = 0.0
    if after_s is not None:
        try:
            proc.wait(after_s)
        except subprocess.TimeoutExpired:
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
            took = time.monotonic() - sent
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err, took


def verdict(folder: Path) -> str:
    try:
        result = verify_folder(str(folder))
    except NotARunFolderError:
        return "no folder"
    if result.damaged:
        return "FAILED: " + "; ".join(result.problems)
    return "OK" if result.ok else "INCOMPLETE"


def first_line_at(argv: list[str], words: str) -> tuple[float, float]:
    """Run the command to its end: the seconds from its start to its first stderr line holding `words`, and
    to its exit."""
    began = time.monotonic()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=embedded_env())
    seen = None
    for line in proc.stderr:
        if seen is None and words in line:
            seen = time.monotonic() - began
    assert proc.wait() == 0 and seen is not None
    return seen, time.monotonic() - began


@pytest.mark.slow
def test_a_stop_at_any_instant_leaves_an_incomplete_folder_that_the_rerun_finishes(tmp_path, tiny_model_dir):
    model = tiny_model_dir("bert")
    claimed, whole = first_line_at(audit_argv(tmp_path / "whole", model), "loading the model")
    # Three before the claim (interpreter start, imports, planning), then INSTANTS spread from the claim
    # to the exit: the shards, the last marker, row_stats.parquet, audit.json, report.html.
    instants = [0.1, claimed / 2, claimed * 0.95] + [
        claimed + (whole - claimed) * (k + 0.5) / INSTANTS for k in range(INSTANTS)
    ]
    seen: dict[str, int] = {}
    for k, at in enumerate(instants):
        folder = tmp_path / f"at{k}"
        argv = audit_argv(folder, model)
        rc, err, took = run(argv, at)
        if rc == 0:  # finished before the signal, or its result stood (the signal came as it exited)
            state = verdict(folder / "out")
            assert state == "OK", f"a finished run at {at:.2f} s: {state}"
        else:
            assert rc == 143, f"stopped at {at:.2f} s: exit {rc}\n{err[-2000:]}"
            assert took <= STOP_S, f"stopped at {at:.2f} s: exited {took:.1f} s after the signal"
            assert err.rstrip().splitlines()[-1].startswith("dscore: stopped by SIGTERM"), err[-2000:]
            assert not (folder / "out" / LOCK_FILE).exists(), f"stopped at {at:.2f} s: the lock was left"
            state = "no folder" if not (folder / "out").exists() else verdict(folder / "out")
            assert state in ("INCOMPLETE", "no folder"), f"stopped at {at:.2f} s, verify says {state}"
        seen[state] = seen.get(state, 0) + 1
        rc, err, _ = run(argv)
        assert rc == 0, f"the rerun after a stop at {at:.2f} s: exit {rc}\n{err[-2000:]}"
        assert verdict(folder / "out") == "OK", f"the rerun after a stop at {at:.2f} s"
    assert seen.get("INCOMPLETE", 0) >= INSTANTS // 2, seen  # most instants cut a claimed run short
