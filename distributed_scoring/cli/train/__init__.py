"""`dscore train`: training jobs on Ray Train, one subcommand per trainer; a trainer is one module here
(`add_arguments`, `run`) and one entry in TRAINERS."""

from __future__ import annotations

import argparse

from ..common import Command, add_commands, dispatch
from . import maskless, pmlm

TRAINERS = (
    Command(
        "maskless",
        "distil a PLL run into a student that predicts each PLL in one forward pass",
        "A student that predicts each PLL in one forward pass of the unmasked sentence: the MLM's encoder "
        "and a head over [CLS] regressed on the PLL (--target sentence, Salazar et al. 2020, sec. 2.2), or the MLM "
        "itself fitted per position to the teacher's terms or conditionals (--target token|distribution). "
        "DIR/report.json and report.md: held-out agreement with the teacher beside the unmasked and length-only "
        "baselines, mutant-minus-parent differences, N-best rescoring, speed-up over the PLL. Score with "
        "`dscore score --maskless DIR`. Exit codes: 0 done, 1 the run failed (rerun the command to continue from "
        "its latest checkpoint), 2 bad input or options.",
        module=maskless,
    ),
    Command(
        "pmlm",
        "continue training a masked LM with the u-PMLM objective (masking ratio ~ U(0, 1))",
        "Liao et al. (2020): per sequence a masking ratio r ~ U(0, 1], that share of its tokens masked, "
        "cross-entropy on them. DIR is a model folder (`dscore score --model DIR`); DIR/report.json: held-out "
        "chain-rule perplexity, left-to-right and in random orders, before and after. Exit codes: 0 done, "
        "1 the run failed (rerun the command to continue from its latest checkpoint), 2 bad input or options.",
        module=pmlm,
    ),
)

COMMAND = Command(
    "train",
    "training jobs on Ray Train: u-PMLM, maskless scorers",
    place=100,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_commands(p, TRAINERS, dest="trainer")


def run(args: argparse.Namespace) -> int:
    return dispatch(TRAINERS, args.trainer, args)
