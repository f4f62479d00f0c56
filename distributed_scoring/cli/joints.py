"""`dscore joints`: pairwise joints from an MLM's conditionals (MLM, MRF, MRF-L, HCB, AG) and their
divergences."""

from __future__ import annotations

import argparse

from .common import (
    Command,
    add_inputs,
    add_model_arguments,
    add_options,
    add_text_column,
    finish,
    model_spec,
    options_from,
    ray_options,
    shard_rows,
)

COMMAND = Command(
    "joints",
    "pairwise joints (MLM, MRF, MRF-L, HCB, AG) from MLM conditionals, with U-PPL, P-PPL, A-KL, G-KL",
    place=30,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..engine.joint_stats import JointOptions
    from ..workflows.joints import JointsInputs

    add_inputs(p, "a text corpus (pairs drawn by --scheme) or one JSONL of given pairs (text, positions: [a, b])")
    # No --variant: the paper's conditionals mask exactly the pair (`conditionals.py`), not a PLL's words.
    add_model_arguments(p, shard_rows=50, variant=False)
    add_text_column(p, "column holding the text of a corpus (default: text)")
    add_options(p, JointsInputs)
    add_options(p, JointOptions, ["ag_iterations", "pivot"])
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="approximation: restrict V to the gold tokens and the top-k of each conditional",
    )


def run(args: argparse.Namespace) -> int:
    from ..engine.joint_stats import JointOptions
    from ..workflows.joints import JointsInputs, pairwise_joints

    inputs = options_from(
        args,
        JointsInputs,
        paths=tuple(args.inputs),
        output=args.output,
        text_column=args.text_column,
        shard_rows=shard_rows(args),
    )
    options = options_from(args, JointOptions)
    summary = pairwise_joints(
        inputs, model_spec(args), options, args.batch_tokens, args.top_k, ray_options(args), args.overwrite
    )
    return finish(args, summary)
