"""SIGTERM (what Slurm, Kubernetes and systemd send) and SIGINT (Ctrl-C) mid-run, for score, audit and
rescore, in-process and with `--ray`: one line `dscore: stopped by SIG...: N of M shards done; rerun the same
command to resume`, exit 128 + the signal, no traceback, no lock left; the rerun finishes with rows in ==
rows out and `dscore verify` OK.

Before: SIGTERM in-process exited 143 without a word and left `_lock.json`; with `--ray`, exit 134 and Ray's
crash dump; Ctrl-C, a 40-line KeyboardInterrupt traceback.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import rescoring as H
from helpers import tiny
from helpers.driver import embedded_env

DSCORE = str(Path(sys.executable).with_name("dscore"))
LINES = 400


def corpus(folder: Path) -> str:
    path = folder / "many.txt"
    path.write_text("\n".join(tiny.CORPUS[i % len(tiny.CORPUS)] + f" {i}" for i in range(LINES)) + "\n")
    return str(path)


def nbest_lists(folder: Path) -> list[str]:
    paths = []
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(100, 4, seed=seed, prefix=split[0])
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(str(path))
    return ["--dev", paths[0], "--test", paths[1]]


def command(kind: str, folder: Path, model: str, out: Path, ray: bool) -> list[str]:
    inputs = nbest_lists(folder) if kind == "rescore" else [corpus(folder)]
    return [DSCORE, kind, *inputs, "--model", model, "--output", str(out), "--shard-rows", "2"] + (
        ["--ray", "--stall-timeout", "120"] if ray else []
    )


def markers(out: Path) -> int:
    return len(list(out.rglob("_done/*.json")))


def stop_mid_run(argv: list[str], out: Path, signum: int) -> tuple[int, str]:
    """Start the command, send `signum` once it has finished a few shards; its exit code and stderr."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=embedded_env())
    deadline = time.time() + 240
    while markers(out) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be stopped:\n{proc.stderr.read()[-3000:]}"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err


def check_stopped_then_resumed(kind: str, tmp_path: Path, model: str, signum: int, ray: bool) -> None:
    out = tmp_path / "out"
    argv = command(kind, tmp_path, model, out, ray)
    rc, err = stop_mid_run(argv, out, signum)
    name = signal.Signals(signum).name
    lines = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert rc == 128 + signum, err[-3000:]
    assert len(lines) == 1 and re.fullmatch(
        rf"dscore: stopped by {name}: \d+ of \d+ shards done; rerun the same command to resume", lines[0]
    ), err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert not list(out.rglob("_lock.json")), "the lock was left behind"
    rerun = subprocess.run(argv, capture_output=True, text=True, env=embedded_env())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    verify = subprocess.run([DSCORE, "verify", str(out)], capture_output=True, text=True)
    assert verify.returncode == 0 and "OK" in verify.stdout + verify.stderr, verify.stdout + verify.stderr


CASES = [(kind, signum) for kind in ("score", "audit", "rescore") for signum in (signal.SIGTERM, signal.SIGINT)]


@pytest.mark.parametrize("kind,signum", CASES, ids=[f"{k}-{signal.Signals(s).name}" for k, s in CASES])
def test_a_signal_stops_an_in_process_run_in_one_line_and_the_rerun_resumes(kind, signum, tmp_path, tiny_model_dir):
    check_stopped_then_resumed(kind, tmp_path, str(tiny_model_dir("bert")), signum, ray=False)


@pytest.mark.ray
@pytest.mark.parametrize("kind,signum", CASES, ids=[f"{k}-{signal.Signals(s).name}" for k, s in CASES])
def test_a_signal_stops_a_run_on_ray_in_one_line_and_the_rerun_resumes(kind, signum, tmp_path, tiny_model_dir):
    check_stopped_then_resumed(kind, tmp_path, str(tiny_model_dir("bert")), signum, ray=True)
