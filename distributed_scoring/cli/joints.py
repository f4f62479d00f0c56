"""`dscore joints`: pairwise joints from an MLM's conditionals (MLM, MRF, MRF-L, HCB, AG) and their
divergences."""

from __future__ import annotations

import argparse

from .common import add_inputs, add_model_arguments, add_text_column, finish, model_spec, ray_options, shard_rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..engine.joint_stats import PIVOTS, JointOptions
    from ..workflows.joints import SCHEMES

    d = JointOptions()
    add_inputs(p, "a text corpus (pairs drawn by --scheme) or one JSONL of given pairs (text, positions: [a, b])")
    # No --variant: the paper's conditionals mask exactly the pair (`conditionals.py`), not a PLL's words.
    add_model_arguments(p, shard_rows=50, variant=False)
    add_text_column(p, "column holding the text of a corpus (default: text)")
    p.add_argument(
        "--scheme",
        choices=SCHEMES,
        default="random",
        help="two tokens uniformly at random, or two adjacent tokens (ignored for given pairs)",
    )
    p.add_argument("--examples", type=int, default=1000, help="sentences drawn from the corpus (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawing of sentences and positions")
    p.add_argument("--ag-iterations", type=int, default=d.ag_iterations, help="Arnold-Gokhale iterations (default 50)")
    p.add_argument(
        "--hcb-pivot",
        choices=PIVOTS,
        default=d.pivot,
        help="HCB pivot: mode of the MLM joint (default), mask, the gold token, or the unary mode",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="approximation: restrict V to the gold tokens and the top-k of each conditional",
    )


def run(args: argparse.Namespace) -> int:
    from ..engine.joint_stats import JointOptions
    from ..workflows.joints import JointsInputs, pairwise_joints

    inputs = JointsInputs(
        tuple(args.inputs), args.output, args.scheme, args.examples, args.seed, args.text_column, shard_rows(args)
    )
    options = JointOptions(pivot=args.hcb_pivot, ag_iterations=args.ag_iterations)
    summary = pairwise_joints(
        inputs, model_spec(args), options, args.batch_tokens, args.top_k, ray_options(args), args.overwrite
    )
    return finish(args, summary)
