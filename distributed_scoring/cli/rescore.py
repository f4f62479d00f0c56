"""`dscore rescore`: ASR/MT N-best lists rescored with a masked LM (and a causal LM), the interpolation
weights tuned on dev and applied to test."""

from __future__ import annotations

import argparse

from ..config import ScoringOptions
from ..errors import UserError
from .common import (
    Command,
    add_long_texts,
    add_model_arguments,
    add_options,
    finish,
    model_spec,
    options_from,
    ray_options,
    shard_rows,
    student_folder,
)

COMMAND = Command(
    "rescore",
    "rescore ASR/MT N-best lists with a masked LM (and a causal LM), tuned on dev",
    place=20,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.rescore.run import RescoreInputs
    from ..workflows.rescore.search import RescoreOptions

    p.add_argument("--dev", required=True, help="dev N-best list (see --format): weights are tuned here")
    p.add_argument(
        "--test", required=True, help="test N-best list: the tuned weights are applied here, and it is written back"
    )
    add_options(p, RescoreInputs, skip=["append"])  # the references and how the lists are read
    add_model_arguments(p, maskless=True)
    add_long_texts(p)
    p.add_argument(
        "--method",
        choices=("pll", "unmasked"),
        default="pll",
        help="the masked LM's score of a hypothesis: its PLL (default), or one pass of the unmasked text "
        "(as `dscore score --method unmasked`); --maskless DIR uses a student instead",
    )
    p.add_argument("--causal-model", default=None, help="also interpolate a causal LM (log P with its BOS/EOS)")
    add_options(p, RescoreOptions)  # how the weights are searched on dev and the metric judged
    add_options(p, RescoreInputs, ["append"])


def run(args: argparse.Namespace) -> int:
    from ..workflows.rescore.run import RescoreInputs, rescore_nbest
    from ..workflows.rescore.search import RescoreOptions

    inputs = options_from(
        args, RescoreInputs, dev=args.dev, test=args.test, output=args.output, shard_rows=shard_rows(args)
    )
    options = options_from(args, RescoreOptions)
    scoring = options_from(args, ScoringOptions)
    causal = model_spec(args, args.causal_model) if args.causal_model else None
    student = student_folder(args)
    if student and args.method != "pll":
        raise UserError(f"--maskless DIR scores with a student; it does not go with --method {args.method}")
    result = rescore_nbest(
        inputs,
        model_spec(args, student),
        causal,
        scoring,
        options,
        ray_options(args),
        args.overwrite,
        method="maskless" if student else args.method,
    )
    keys = ("metric", "lambda", "gamma", "mlm_alpha", "causal_alpha", "dev", "test", "edges", "scoring")
    return finish(args, {k: result.report[k] for k in keys})
