"""SIGTERM (what Slurm, Kubernetes and systemd send) and SIGINT (Ctrl-C) mid-run to the driver's whole process
group (as `timeout`, `kill -TERM -PGID` and a terminal send them), for score, audit, rescore and variants,
in-process and with `--ray`: one line `dscore: stopped by SIG...: N of M shards done; rerun the same command to
resume`, printed last, exit 128 + the signal within `STOP_S` of it, no traceback, no lock left; the rerun
finishes with rows in == rows out and `dscore verify` OK.

Before: SIGTERM in-process exited 143 without a word and left `_lock.json`; with `--ray`, exit 134 and Ray's
crash dump; Ctrl-C, a 40-line KeyboardInterrupt traceback. Then, sent to the group on `--ray`: the raylet went
with it and Ray's core worker ended the driver (exit 1, no word, the lock left), or `ray.shutdown` waited 8 s on
the dead processes.
"""

from __future__ import annotations

import json
import os
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
STOP_S = 10.0  # from the signal to the exit: within Kubernetes' 30 s grace with room to spare
WILD = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"


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


def variants_table(folder: Path) -> list[str]:
    """Every single substitution of `WILD` (570 rows), scored by PLL: many shards of real work."""
    path = folder / "assay.csv"
    rows = [
        f"{wt}{i + 1}{mt},{WILD[:i]}{mt}{WILD[i + 1 :]},{(i * 7 + ord(mt)) % 13 / 13:.3f}"
        for i, wt in enumerate(WILD)
        for mt in "ACDEFGHIKLMNPQRSTVWY"
        if mt != wt
    ]
    path.write_text("mutant,mutated_sequence,DMS_score\n" + "\n".join(rows) + "\n")
    return [str(path), "--target-seq", WILD, "--strategy", "pll"]


def command(kind: str, folder: Path, models, out: Path, ray: bool) -> list[str]:
    if kind == "variants":
        inputs, model = variants_table(folder), models["protein"]
    else:
        inputs, model = (nbest_lists(folder) if kind == "rescore" else [corpus(folder)]), models["text"]
    return [DSCORE, kind, *inputs, "--model", str(model), "--output", str(out), "--shard-rows", "2"] + (
        ["--ray", "--stall-timeout", "120"] if ray else []
    )


def markers(out: Path) -> int:
    return len(list(out.rglob("_done/*.json")))


def stop_mid_run(argv: list[str], out: Path, signum: int) -> tuple[int, str, float]:
    """Start the command in a process group of its own, send `signum` to the whole group once it has finished
    a few shards; its exit code, stderr and the seconds from the signal to its exit."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=embedded_env(), start_new_session=True)
    deadline = time.time() + 240
    while markers(out) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be stopped:\n{proc.stderr.read()[-3000:]}"
    sent = time.monotonic()
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err, time.monotonic() - sent


def check_stopped_then_resumed(kind: str, tmp_path: Path, models, signum: int, ray: bool) -> None:
    out = tmp_path / "out"
    argv = command(kind, tmp_path, models, out, ray)
    rc, err, took = stop_mid_run(argv, out, signum)
    name = signal.Signals(signum).name
    lines = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert rc == 128 + signum, err[-3000:]
    assert took <= STOP_S, f"exited {took:.1f} s after the signal\n{err[-3000:]}"
    assert err.rstrip().splitlines()[-1].startswith("dscore: stopped by"), f"the line is not the last\n{err[-3000:]}"
    assert len(lines) == 1 and re.fullmatch(
        rf"dscore: stopped by {name}: \d+ of \d+ shards done; rerun the same command to resume", lines[0]
    ), err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert not list(out.rglob("_lock.json")), "the lock was left behind"
    rerun = subprocess.run(argv, capture_output=True, text=True, env=embedded_env())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    verify = subprocess.run([DSCORE, "verify", str(out)], capture_output=True, text=True)
    assert verify.returncode == 0 and "OK" in verify.stdout + verify.stderr, verify.stdout + verify.stderr


CASES = [
    (kind, signum) for kind in ("score", "audit", "rescore", "variants") for signum in (signal.SIGTERM, signal.SIGINT)
]
IDS = [f"{k}-{signal.Signals(s).name}" for k, s in CASES]


@pytest.fixture
def models(tiny_model_dir, tiny_protein_dir):
    return {"text": tiny_model_dir("bert"), "protein": tiny_protein_dir("bert")}


@pytest.mark.parametrize("kind,signum", CASES, ids=IDS)
def test_a_signal_to_the_group_stops_an_in_process_run_and_the_rerun_resumes(kind, signum, tmp_path, models):
    check_stopped_then_resumed(kind, tmp_path, models, signum, ray=False)


@pytest.mark.ray
@pytest.mark.parametrize("kind,signum", CASES, ids=IDS)
def test_a_signal_to_the_group_stops_a_run_on_ray_and_the_rerun_resumes(kind, signum, tmp_path, models):
    check_stopped_then_resumed(kind, tmp_path, models, signum, ray=True)
