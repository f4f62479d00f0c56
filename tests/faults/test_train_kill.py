"""A training run killed mid-way (the driver and the embedded Ray it started) continues from its latest
checkpoint when the same command runs again: no step is lost or done twice in metrics.jsonl, and the
rerun says where it continued from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from distributed_scoring.cli import main

from helpers.driver import embedded_env, make_corpus
from helpers.local_cluster import running

pytestmark = pytest.mark.ray
STEPS, EVERY = 200, 20


def checkpoints(out: Path) -> list[int]:
    return (
        sorted(int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*"))
        if (out / "checkpoints").exists()
        else []
    )


def registered(out: Path) -> bool:
    """Ray Train has registered a checkpoint: its checkpoint manager's snapshot, what a rerun restores from,
    is written. A checkpoint folder alone is not enough: the controller registers reports on its poll, so a
    run killed before it did starts over (a fast tiny run writes two folders within one poll)."""
    return (out / "checkpoints" / "checkpoint_manager_snapshot.json").exists()


def test_a_killed_training_run_continues_from_its_latest_checkpoint(tmp_path, tiny_model_dir):
    corpus, model = make_corpus(tmp_path / "in", 40), str(tiny_model_dir("bert"))
    assert (
        main(
            [
                "score",
                corpus,
                "--model",
                model,
                "--per-token",
                "--conditionals",
                "1000",
                "--output",
                str(tmp_path / "teacher"),
            ]
        )
        == 0
    )  # what the default student (distribution) is fitted to
    out = tmp_path / "student"
    command = [
        sys.executable,
        "-m",
        "distributed_scoring.cli",
        "train",
        "maskless",
        "--teacher",
        str(tmp_path / "teacher"),
        "--model",
        model,
        "--output",
        str(out),
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--batch-size",
        "4",
        "--cpus-per-worker",
        "1",
        "--heldout",
        "0.2",
    ]
    log = (tmp_path / "first.log").open("w")
    driver = subprocess.Popen(command, start_new_session=True, env=embedded_env(), stdout=log, stderr=log)
    family: list[psutil.Process] = []
    try:
        deadline = time.time() + 300
        while not (len(checkpoints(out)) >= 2 and registered(out)) and driver.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        family = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        psutil.wait_procs(family, timeout=30)
    finally:
        for proc in family:
            if running(proc.pid):
                proc.kill()
    saved = checkpoints(out)
    assert len(saved) >= 2 and saved[-1] < STEPS, f"checkpoints {saved} when the run was killed"
    assert not (out / "report.json").exists()

    rerun = subprocess.run(command, env=embedded_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed_from = [
        int(line.rsplit("step-", 1)[1]) for line in rerun.stderr.splitlines() if "continuing from checkpoint" in line
    ]
    # the latest checkpoint Ray Train had registered: the newest folder may have been cut off mid-copy
    assert resumed_from and resumed_from[0] in saved and resumed_from[0] >= EVERY, rerun.stderr[-3000:]
    # the workers' lines reach the driver's terminal although Ray keeps its workers' output off it
    assert f"maskless step {STEPS}/{STEPS}: loss" in rerun.stderr, rerun.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # the steps after the checkpoint were done again, once
    assert checkpoints(out)[-1] == STEPS
    assert json.loads(rerun.stdout)["training"]["steps"] == STEPS
