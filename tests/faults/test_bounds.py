"""Absurd numeric options are refused before any work, in one line naming the bounds,
and work whose memory grows with its options is sized first and refused when this machine cannot hold it.

`sample --epochs 1000000000` grew to 19.4 GB in two minutes (and set Ray's out-of-memory killer on other
work), `--chains 100000000` likewise; `--stall-timeout -1` and `nan` were taken (Ray options were checked
only with --ray, and nan passes every comparison). (Rescoring's `hyp_id` 0 and -1: test_rescore_inputs.py.)
"""

from __future__ import annotations

import logging

import pytest

from distributed_scoring.cli import main

from helpers.cli import refusal

# (command and its arguments before the flag, flag, absurd value, the bounds the line must give)
SCORE = ["score", "IN"]
CHAIN = ["score", "IN", "--method", "chain", "--order", "random"]
AUDIT = ["audit", "IN"]
RESCORE = ["rescore", "--dev", "IN", "--test", "IN"]
TRAIN = ["train", "pmlm", "--data", "IN"]
ABSURD = [
    (SCORE, "--stall-timeout", "-1", "above 0"),
    (SCORE, "--stall-timeout", "nan", "a finite number above 0"),
    (SCORE, "--stall-timeout", "0", "above 0"),
    (SCORE, "--stall-timeout", "inf", "a finite number above 0"),
    (SCORE, "--cpus-per-actor", "nan", "a finite number above 0"),
    (SCORE, "--num-actors", "0", "at least 1"),
    (SCORE, "--shard-rows", "0", "at least 1"),
    (SCORE, "--batch-tokens", "-5", "at least 1"),
    (CHAIN, "--orders", "0", "at least 1"),
    (AUDIT, "--confidence", "nan", "a finite number in [0.5, 1)"),
    (AUDIT, "--confidence", "1", "in [0.5, 1)"),
    (AUDIT, "--max-pppl-increase", "nan", "a finite number at least 0"),
    (AUDIT, "--max-pppl-increase", "-0.1", "at least 0"),
    (AUDIT, "--max-pppl-decrease", "1", "in [0, 1)"),
    (AUDIT, "--max-error-rate-increase", "2", "in [0, 1]"),
    (AUDIT, "--min-rows", "1", "at least 2"),
    (AUDIT, "--seed", "-1", "at least 0"),
    (AUDIT, "--outlier-k", "nan", "a finite number above 0"),
    (RESCORE, "--mlm-alpha", "nan", "a finite number in [0, 10]"),
    (RESCORE, "--seq-alpha", "-1", "in [0, 10]"),
    (RESCORE, "--lambda-max", "inf", "a finite number in [0, 1000]"),
    (RESCORE, "--lambda-limit", "1e9", "in [0, 1000]"),
    (["joints", "IN"], "--examples", "0", "at least 1"),
    (["joints", "IN"], "--ag-iterations", "0", "at least 1"),
    (["joints", "IN"], "--top-k", "0", "at least 1"),
    (["infill", "IN"], "--beam", "0", "at least 1"),
    (["infill", "IN"], "--temperature", "inf", "a finite number above 0"),
    (["infill", "IN"], "--top-p", "nan", "a finite number in (0, 1]"),
    (["infill", "IN"], "--exact-limit", "-1", "at least 1"),
    (["sample", "IN"], "--epochs", "0", "at least 1"),
    (["sample", "IN"], "--chains", "-3", "at least 1"),
    (["sample", "IN"], "--anneal", "nan", "a finite number at least 0"),
    (["sample", "IN"], "--target-temperature", "0", "above 0"),
    (["sample", "IN"], "--burn-in", "-1", "at least 0"),
    (["generate", "IN"], "--num-sequences", "0", "at least 1"),
    (["generate", "IN"], "--temperature", "nan", "a finite number at least 0"),
    (["generate", "IN"], "--top-p", "0", "in (0, 1]"),
    (["generate", "IN"], "--batch-tokens", "0", "at least 1"),
    (TRAIN, "--lr", "inf", "a finite number above 0"),
    (TRAIN, "--heldout", "1", "in (0, 1)"),
    (TRAIN, "--seed", "-2", "at least 0"),
    (TRAIN, "--cpus-per-worker", "nan", "a finite number above 0"),
    (TRAIN, "--checkpoint-every", "0", "at least 1"),
]


@pytest.mark.parametrize("command, flag, value, bounds", ABSURD, ids=[f"{c[0]} {f} {v}" for c, f, v, _ in ABSURD])
def test_an_absurd_value_is_refused_in_one_line_naming_its_bounds(tmp_path, capsys, command, flag, value, bounds):
    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox\n")
    out = tmp_path / "out"
    args = [str(corpus) if a == "IN" else a for a in command]
    line = refusal(capsys, [*args, "--model", "unused-model", "--output", str(out), flag, value])
    assert line.startswith(f"dscore: error: {flag} ") and line.endswith(f" is out of bounds: it must be {bounds}"), line
    assert not out.exists()


GROWING = [  # (arguments, what the refusal says the memory is for, the flags it says to lower)
    (["sample", "IN", "--epochs", "1000000000"], "x 1,000,000,000 recorded epochs", "lower --epochs"),
    (["sample", "IN", "--chains", "100000000"], "x 100,000,000 chains", "--chains or --shard-rows"),
    (["infill", "IN", "--beam", "1000000000"], "x 1,000,000,000 beams", "lower --beam or --shard-rows"),
    (
        ["generate", "--length", "5", "--num-sequences", "1000000000"],
        "the 1,000,000,000 prompts of --length 5",
        "lower --num-sequences",
    ),
    (
        ["score", "IN", "--method", "chain", "--order", "random", "--orders", "1000000000"],
        "x 1,000,000,000 orders",
        "lower --orders or --shard-rows",
    ),
]


@pytest.mark.parametrize("args, what, flags", GROWING, ids=[" ".join(a[:1] + a[2:]) for a, _, _ in GROWING])
def test_work_too_big_for_this_machine_is_refused_at_once_naming_the_flags(
    tmp_path, tiny_model_dir, capsys, caplog, args, what, flags
):
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.memory")
    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox\n")
    out = tmp_path / "out"
    args = [str(corpus) if a == "IN" else a for a in args]
    line = refusal(capsys, [*args, "--model", str(tiny_model_dir("bert")), "--output", str(out)])
    assert line.startswith(f"dscore: error: dscore {args[0]}") and "of memory for" in line and what in line
    assert "this machine has free" in line and flags in line
    assert "needs about" in caplog.text  # the estimate is printed before the refusal
    assert not out.exists()


def test_the_estimate_is_printed_and_checked_against_the_free_memory(
    tmp_path, tiny_model_dir, capsys, caplog, monkeypatch
):
    """A default sampling run needs a few MiB: it is refused only on a machine with less free than that."""
    from distributed_scoring.pipeline import memory

    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.memory")
    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox\n")
    args = ["sample", str(corpus), "--model", str(tiny_model_dir("bert")), "--output", str(tmp_path / "out")]
    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 20)
    line = refusal(capsys, args)
    assert "more than the 1 MiB this machine has free: lower --epochs" in line
    monkeypatch.undo()
    capsys.readouterr()
    assert main(args) == 0
    assert (
        "memory: dscore sample needs about" in caplog.text and "MiB for one shard of 50 rows x 1 chains" in caplog.text
    )
