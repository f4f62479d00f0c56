"""rescore, audit and train declare each option once: the options classes' fields carry their flags, the
commands derive them (`cli.common.add_options`) and read them back (`options_from`) into what the commands
built by hand before, the classes refuse a bad value naming its flag, and what the folders and audit.json
record of them is what they recorded before (so those folders resume and those baselines read)."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from distributed_scoring.cli import build_parser
from distributed_scoring.cli.common import options_from
from distributed_scoring.errors import UserError
from distributed_scoring.io.nbest_formats import FormatOptions
from distributed_scoring.options import flag_name, flagged
from distributed_scoring.workflows.audit.outliers import OutlierRule
from distributed_scoring.workflows.audit.verdicts import Thresholds
from distributed_scoring.workflows.rescore.run import RescoreInputs, _fingerprint
from distributed_scoring.workflows.rescore.search import RescoreOptions
from distributed_scoring.workflows.train.maskless import LR as MASKLESS_LR
from distributed_scoring.workflows.train.maskless_job import NBest, StudentOptions
from distributed_scoring.workflows.train.pmlm import LR as PMLM_LR
from distributed_scoring.workflows.train.run import TrainOptions, TrainResources

from helpers.cli import refusal

RESCORE = ["rescore", "--dev", "d", "--test", "t", "--model", "m", "--output", "out"]
AUDIT = ["audit", "in.txt", "--model", "m", "--output", "out"]
PMLM = ["train", "pmlm", "--data", "in.txt", "--model", "m", "--output", "out"]
MASKLESS = ["train", "maskless", "--teacher", "scores", "--model", "m", "--output", "out"]

# Each class's fields and defaults, in order, as the folders' _run.json and audit.json recorded them before
# the fields carried their flags.
RECORDED_BEFORE = {
    RescoreOptions: {
        "metric": "wer", "mlm_alpha": None, "causal_alpha": None, "seq_alpha": 0.0, "lambda_max": 1.0,
        "lambda_limit": 64.0, "lambda_step": 0.05, "gamma_step": 0.1, "bleu_tokenize": "13a", "bleu_lowercase": False,
    },
    FormatOptions: {"kaldi_acwt": 1.0, "beam_size": None},
    Thresholds: {
        "metric": "pppl_token", "max_pppl_increase": 0.05, "max_pppl_decrease": None, "max_error_rate_increase": 0.01,
        "min_rows": 10, "confidence": 0.95, "seed": 0, "accept_insufficient": False,
    },
    OutlierRule: {"k": 3.5, "low_tail": False, "min_tokens": 1, "scope": "partition", "min_sigma": 0.05},
    TrainOptions: {
        "epochs": 3, "steps": None, "lr": 5e-5, "batch_size": 16, "seed": 0, "max_length": 128, "heldout": 0.1,
    },
    TrainResources: {
        "num_workers": 1, "use_gpu": False, "cpus_per_worker": 2.0, "checkpoint_every": 100, "address": None,
    },
    StudentOptions: {"target": "distribution", "parent_separator": None, "freeze_layers": 0, "token_weight": 1.0},
}  # fmt: skip
COMMAND = {
    RescoreInputs: RESCORE, RescoreOptions: RESCORE, Thresholds: AUDIT, OutlierRule: AUDIT, TrainOptions: PMLM,
    TrainResources: PMLM, StudentOptions: MASKLESS, NBest: MASKLESS,
}  # fmt: skip


def _args(command: list[str], *flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*command, *flags])


def _flags(command: list[str]) -> set[str]:
    """Every flag of the (sub)command `command` names."""
    parser = build_parser()
    for word in command[: 2 if command[0] == "train" else 1]:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    return {s for action in parser._actions for s in action.option_strings}


@pytest.mark.parametrize("cls", list(RECORDED_BEFORE), ids=lambda c: c.__name__)
def test_what_is_recorded_is_what_was_recorded_before(cls):
    assert list(dataclasses.asdict(cls()).items()) == list(RECORDED_BEFORE[cls].items())


def test_the_rescore_fingerprint_is_what_it_was():
    run = _fingerprint(RescoreInputs("d", "t", "out"), None, None, "pll")
    assert list(run.items()) == [
        ("workload", "rescore"), ("dev", "d"), ("test", "t"), ("dev_refs", None), ("test_refs", None), ("append", ""),
        ("shard_rows", 1000), ("model", None), ("causal_model", None), ("method", "pll"),
    ]  # fmt: skip


@pytest.mark.parametrize("cls", list(COMMAND), ids=lambda c: c.__name__)
def test_every_flagged_field_is_a_flag_of_its_command(cls):
    assert {flag_name(f, spec) for f, spec in flagged(cls)} <= _flags(COMMAND[cls])


def test_rescore_flags_read_back_into_what_the_command_built_before():
    args = _args(
        RESCORE, "--dev-refs", "dr", "--format", "kaldi", "--kaldi-acwt", "0.1", "--beam-size", "4", "--append", ".",
        "--metric", "bleu", "--mlm-alpha", "0.6", "--seq-alpha", "0.6", "--lambda-max", "2", "--bleu-tokenize", "none",
    )  # fmt: skip
    inputs = options_from(args, RescoreInputs, dev=args.dev, test=args.test, output=args.output, shard_rows=1000)
    assert inputs == RescoreInputs("d", "t", "out", "dr", None, ".", 1000, "kaldi", 0.1, 4)
    assert inputs.formats == FormatOptions(0.1, 4)
    options = options_from(args, RescoreOptions)
    assert options == RescoreOptions(
        metric="bleu", mlm_alpha=0.6, causal_alpha=None, seq_alpha=0.6, lambda_max=2.0, lambda_limit=64.0,
        bleu_tokenize="none",
    )  # fmt: skip
    plain = _args(RESCORE)
    assert options_from(plain, RescoreOptions) == RescoreOptions()
    assert options_from(plain, RescoreInputs, dev="d", test="t", output="out") == RescoreInputs("d", "t", "out")


def test_audit_flags_read_back_into_what_the_command_built_before():
    args = _args(
        AUDIT, "--metric", "pppl_word", "--max-pppl-decrease", "0.2", "--min-rows", "5", "--confidence", "0.9",
        "--seed", "3", "--accept-insufficient", "--outlier-min-sigma", "0", "--outlier-k", "2.5",
        "--outlier-scope", "overall", "--low-tail",
    )  # fmt: skip
    assert options_from(args, Thresholds) == Thresholds(
        metric="pppl_word", max_pppl_decrease=0.2, min_rows=5, confidence=0.9, seed=3, accept_insufficient=True
    )
    assert options_from(args, OutlierRule) == OutlierRule(k=2.5, low_tail=True, scope="overall", min_sigma=0.0)
    plain = _args(AUDIT)
    assert (options_from(plain, Thresholds), options_from(plain, OutlierRule)) == (Thresholds(), OutlierRule())


def test_train_flags_read_back_into_what_the_commands_built_before():
    args = _args(
        MASKLESS, "--target", "token", "--parent-separator", "~", "--freeze-layers", "2", "--token-weight", "0.5",
        "--nbest-dev", "d", "--nbest-test", "t", "--nbest-metric", "bleu", "--steps", "7", "--heldout", "0.3",
        "--num-workers", "2", "--use-gpu", "--cpus-per-worker", "1.5", "--address", "auto",
    )  # fmt: skip
    assert options_from(args, StudentOptions) == StudentOptions("token", "~", 2, 0.5)
    assert options_from(args, NBest, dev=args.nbest_dev, test=args.nbest_test) == NBest("d", "t", "bleu")
    assert options_from(args, TrainOptions) == TrainOptions(steps=7, lr=MASKLESS_LR, heldout=0.3)
    resources = options_from(args, TrainResources, address=args.address)
    assert resources == TrainResources(2, True, 1.5, 100, "auto")
    # each trainer keeps its own default learning rate, and --help shows it
    assert options_from(_args(PMLM), TrainOptions) == TrainOptions(lr=PMLM_LR)
    assert options_from(_args(MASKLESS), TrainOptions) == TrainOptions(lr=MASKLESS_LR)
    assert options_from(_args(MASKLESS), StudentOptions) == StudentOptions()


@pytest.mark.parametrize(
    "make, flag",
    [
        (lambda: RescoreOptions(metric="cer"), "--metric 'cer' is not one of wer, bleu"),
        (lambda: RescoreOptions(lambda_max=2.0, lambda_limit=1.0), r"lambda_limit \(1.0\) must be at least"),
        (lambda: RescoreInputs("d", "t", "o", kaldi_acwt=0.0), "--kaldi-acwt 0 is out of bounds"),
        (lambda: RescoreInputs("d", "t", "o", beam_size=0), "--beam-size 0 is out of bounds"),
        (lambda: Thresholds(metric="accuracy"), "--metric 'accuracy' is not one of pppl_token, pppl_word"),
        (lambda: Thresholds(confidence=1.0), r"--confidence 1 is out of bounds: it must be in \[0.5, 1\)"),
        (lambda: OutlierRule(scope="file"), "--outlier-scope 'file' is not one of overall, partition"),
        (lambda: OutlierRule(min_sigma=-1.0), "--outlier-min-sigma -1 is out of bounds"),
        (lambda: OutlierRule(min_tokens=0), "outlier min_tokens must be at least 1"),
        (lambda: TrainOptions(heldout=1.0), r"--heldout 1 is out of bounds: it must be in \(0, 1\)"),
        (lambda: TrainOptions(steps=0), "--steps 0 is out of bounds"),
        (lambda: TrainResources(num_workers=0), "--num-workers 0 is out of bounds"),
        (lambda: StudentOptions(target="logits"), "--target 'logits' is not one of sentence, token, distribution"),
        (lambda: StudentOptions(freeze_layers=-1), "--freeze-layers -1 is out of bounds: it must be at least 0"),
        (lambda: StudentOptions(token_weight=math.nan), "--token-weight nan is out of bounds"),
        (lambda: StudentOptions(parent_separator=""), "--parent-separator must be a non-empty string"),
        (lambda: NBest("d", "t", "cer"), "--nbest-metric 'cer' is not one of wer, bleu"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_its_flag(make, flag):
    with pytest.raises(UserError, match=flag):
        make()


@pytest.mark.parametrize(
    "command, flag, value",
    [
        (["rescore", "--dev", "IN", "--test", "IN"], "--kaldi-acwt", "0"),
        (["rescore", "--dev", "IN", "--test", "IN"], "--beam-size", "0"),
        (["audit", "IN"], "--outlier-min-sigma", "-1"),
        (["train", "maskless", "--teacher", "IN"], "--freeze-layers", "-1"),
        (["train", "maskless", "--teacher", "IN"], "--token-weight", "nan"),
        (["train", "pmlm", "--data", "IN"], "--steps", "0"),
    ],
)
def test_the_command_refuses_it_before_any_work(tmp_path, capsys, command, flag, value):
    corpus = tmp_path / "in.txt"
    corpus.write_text("the fox\n")
    out = tmp_path / "out"
    args = [str(corpus) if a == "IN" else a for a in command]
    line = refusal(capsys, [*args, "--model", "unused-model", "--output", str(out), flag, value])
    assert line.startswith(f"dscore: error: {flag} {value} is out of bounds"), line
    assert not out.exists()
