"""The trial's stops and checks: SIGTERM and Ctrl-C mid-run (a stopped run ends in one line and the rerun
completes), models that cannot be masked LMs (refused before a folder is claimed), the machine's limits (a
folder name too long for the filesystem, a low open-files limit)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from distributed_scoring.stopping import REPEAT_S

from helpers.driver import embedded_env
from helpers.trial.cases import (
    KILL_LINES,
    REFUSED_LINE,
    STOP,
    Cases,
    M,
    corpus,
    score_argv,
)
from helpers.trial.dscore import RAY_TIMEOUT_S, TIMEOUT_S, Call, descendants_of, reap
from helpers.trial.judge import Outcome, Trial, markers

CASES = Cases(STOP)
case = CASES.add

STOPPED_LINE = (
    "exit 143 (SIGTERM) or 130 (SIGINT), one line `stopped by ...: N of M shards done; rerun ...`, no "
    "traceback, no lock left; the rerun exit 0, rows in == rows out, no repeated id, verify OK"
)


STOP_S = 10.0  # from the signal to the exit (Kubernetes kills after 30 s)


def stopped(
    t: Trial,
    d: Path,
    argv: Sequence[str],
    rows_in: int,
    signum: int,
    spawn: bool = False,
    twice: float | None = None,
    group: bool = False,
    when: Callable[[Path], bool] = lambda out: markers(out) >= 2,
    at: str = "after 2 shards",
) -> Outcome:
    """Send `signum` once `when(out)` holds (to the process group with `group`, as `timeout` and a terminal
    do; `twice`: again that many seconds later), then rerun the same command."""
    process = t.dscore.start(argv, d, spawn=spawn)
    deadline = time.monotonic() + (RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    while not when(d / "out") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    alive = process.poll() is None
    descendants = descendants_of(process.pid)
    sent = time.monotonic()
    (os.killpg if group else os.kill)(process.pid, signum)
    if twice is not None:
        time.sleep(twice)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
    call = process.wait(RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    took = time.monotonic() - sent
    reap(descendants)
    name = signal.Signals(signum).name
    o = t.observe(call, d, "out", rows_in, f"{name}{' to the group' if group else ''} {at}")
    o.check(alive, "the command ended before the signal")
    o.check(call.rc == 128 + signum, f"exit {call.rc}, expected {128 + signum}")
    o.check(took <= STOP_S, f"it exited {took:.1f} s after the signal")
    o.check(not call.traceback and "SIGTERM received" not in call.err, "a traceback or a crash dump")
    o.check(o.verdict in ("INCOMPLETE", "-"), f"verify says {o.verdict} after the stop")  # -: no folder
    if twice is None or twice < REPEAT_S:  # a later second signal exits at once: its line and lock are not promised
        o.check(len(call.lines) == 1 and f"stopped by {name}" in call.line, f"the line was {call.line!r}")
        o.check(call.err.rstrip().endswith(call.line), "the line is not the last")
        o.check(not (d / "out" / "_lock.json").exists(), "the lock was left behind")
    rerun = t.call(d, *argv, spawn=spawn)
    after = t.observe(rerun, d, "out", rows_in, o.done)
    after.problems = o.problems + after.problems
    return t.complete(after, rerun)


@case(
    "S01",
    "SIGTERM to `score` mid-run (what Slurm, Kubernetes, systemd send), then the same command",
    STOPPED_LINE,
)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGTERM)


@case("S02", "Ctrl-C (SIGINT) to `score` mid-run, then the same command", STOPPED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGINT)


@case("S03", "SIGTERM to `score --ray` mid-run, then the same command", STOPPED_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES), "--ray"), KILL_LINES, signal.SIGTERM, spawn=True)


@case("S04", "Ctrl-C to `score --ray` mid-run, then the same command", STOPPED_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES), "--ray"), KILL_LINES, signal.SIGINT, spawn=True)


@case(
    "S05",
    "SIGTERM twice 2 s apart to `score` mid-run, then the same command",
    "exit 143 at once; the rerun exit 0, rows in == rows out, no repeated id, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGTERM, twice=2.0)


@case(
    "S14",
    "SIGTERM twice within 50 ms to `score` mid-run (what `timeout` sends), then the same command",
    STOPPED_LINE,
)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, score_argv(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGTERM, twice=0.05)


GROUP_LINE = f"within {STOP_S:.0f} s of the signal: {STOPPED_LINE}"


@case("S15", "SIGTERM to the process group of `score --ray` (timeout -s TERM, kill -TERM -PGID)", GROUP_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES), "--ray")
    return stopped(t, d, argv, KILL_LINES, signal.SIGTERM, spawn=True, group=True)


@case("S16", "SIGINT to the process group of `audit --ray` (Ctrl-C in its terminal)", GROUP_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    argv = ["audit", *score_argv(corpus(d, KILL_LINES), "--ray")[1:]]
    return stopped(t, d, argv, KILL_LINES, signal.SIGINT, spawn=True, group=True)


@case("S17", "SIGTERM to the group of `score` 0.3 s after its start, before it claims its folder", GROUP_LINE)
def _(t: Trial, d: Path) -> Outcome:
    began = time.monotonic()
    argv = score_argv(corpus(d, KILL_LINES))
    when = lambda out: time.monotonic() - began >= 0.3  # noqa: E731
    return stopped(t, d, argv, KILL_LINES, signal.SIGTERM, spawn=True, group=True, when=when, at="after 0.3 s")


@case("S18", "SIGTERM to the group of `score` the moment its lock file appears", GROUP_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES))
    when = lambda out: (out / "_lock.json").exists()  # noqa: E731
    return stopped(t, d, argv, KILL_LINES, signal.SIGTERM, spawn=True, group=True, when=when, at="at the lock")


@case("S19", "SIGTERM to the group of `audit` the moment its last shard is marked", GROUP_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = ["audit", *score_argv(corpus(d, KILL_LINES))[1:]]
    when = lambda out: markers(out) >= KILL_LINES // 2  # noqa: E731
    return stopped(t, d, argv, KILL_LINES, signal.SIGTERM, spawn=True, group=True, when=when, at="at the last marker")


@case("S20", "SIGTERM to the group of `audit` the moment row_stats.parquet appears (its summary step)", GROUP_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = ["audit", *score_argv(corpus(d, KILL_LINES))[1:]]
    when = lambda out: (out / "row_stats.parquet").exists()  # noqa: E731
    return stopped(t, d, argv, KILL_LINES, signal.SIGTERM, spawn=True, group=True, when=when, at="in its summary")


def _bad_model(d: Path, kind: str) -> str:
    """A model folder made from the trial's tiny BERT that cannot be used as a masked LM."""
    from transformers import BertModel, T5Config, T5ForConditionalGeneration

    good, folder = d.parent / "_models" / "bert", d / "model"
    if kind == "truncated":
        shutil.copytree(good, folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return "model"
    model = BertModel.from_pretrained(good) if kind.startswith("headless") else None
    if model is None:
        model = T5ForConditionalGeneration(T5Config(vocab_size=300, d_model=16, d_ff=32, num_layers=1, num_heads=2))
    model.save_pretrained(folder)
    for f in good.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, folder / f.name)
    if kind == "headless-unlabelled":  # nothing in its config says what it is: only loading the weights tells
        config = json.loads((folder / "config.json").read_text())
        config.pop("architectures", None)
        (folder / "config.json").write_text(json.dumps(config))
    return "model"


for _id, _kind, _words, _ray in (
    ("S06", "headless", "no trained masked-LM head", False),
    ("S07", "t5", "no masked-LM class", False),
    ("S08", "truncated", "are damaged", False),
    ("S09", "headless-unlabelled", "no trained masked-LM head", False),
    ("S10", "t5", "no masked-LM class", True),
    ("S11", "headless-unlabelled", "could not start: ModelLoadError", True),
):

    def _refused_model(t: Trial, d: Path, kind: str = _kind, words: str = _words, ray: bool = _ray) -> Outcome:
        model = _bad_model(d, kind)
        argv = ["score", corpus(d, 4), "--model", model, "--output", "out", *(["--ray"] if ray else [])]
        if not ray:
            return t.refused(d, argv, [words])
        call = t.call(d, *argv, spawn=True)
        o = t.observe(call, d, "out", 4)
        t.one_line(o, call, 2, [words])
        o.check(not (d / "out").exists(), "out/ was created")
        return o

    case(
        _id,
        f"score{' --ray' if _ray else ''} with a {_kind} model (bare BertModel, T5, half a model.safetensors; "
        "'unlabelled': a bare encoder whose config does not say so)",
        f"{REFUSED_LINE} (no folder claimed)",
        ray=_ray,
    )(_refused_model)


@case("S12", "score into a path with a 300-character folder name", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(
        d, ["score", corpus(d, 4), "--model", M, "--output", "a" * 300], ["longer than the filesystem"], out=None
    )


@case("S13", "score --ray under `ulimit -n 64`", f"{REFUSED_LINE}, before Ray starts", ray=True)
def _(t: Trial, d: Path) -> Outcome:
    argv = [sys.executable, "-m", "distributed_scoring.cli", "score", corpus(d, 4), "--model", M, "--output", "out"]
    done = subprocess.run(
        [*argv, "--ray"],
        cwd=d,
        capture_output=True,
        text=True,
        timeout=RAY_TIMEOUT_S,
        env=embedded_env(),
        preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE, (64, 64)),
    )
    call = Call(argv[3:], done.returncode, done.stdout, done.stderr)
    o = t.observe(call, d, "out", 4)
    t.one_line(o, call, 2, ["open-files limit is 64"])
    o.check(not (d / "out").exists(), "out/ was created")
    return o
