"""`dscore score`: the PLL of every sentence; with --method chain the chain rule along an order, with
--method unmasked one pass of the unmasked sentence, with --maskless a student's predicted PLL."""

from __future__ import annotations

import argparse

from ..errors import UserError
from .common import (
    Command,
    add_options,
    add_score_arguments,
    finish,
    options_from,
    ray_options,
    run_config,
    student_folder,
)

COMMAND = Command(
    "score",
    "PLL of every sentence, Parquet out, corpus PPPL in summary.json",
    place=10,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_score_arguments(p, maskless=True)
    _add_chain_arguments(p)


def _pll(args: argparse.Namespace) -> int:
    if student_folder(args):
        from ..workflows.maskless import score_maskless as score
    else:
        from ..workflows.score import score
    return finish(args, score(run_config(args), ray_options(args), overwrite=args.overwrite))


def _add_chain_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.chain import ChainOptions

    g = p.add_argument_group(
        "chain rule",
        "--method chain: log p(x) = sum_k log p(x_s(k) | x_s(<k)) along an order s "
        "(the likelihood of a u-PMLM; for other MLMs an approximation)",
    )
    g.add_argument(
        "--method",
        choices=("pll", "chain", "unmasked"),
        default="pll",
        help="pll: pseudo-log-likelihood (default); chain: chain-rule log-likelihood along --order; "
        "unmasked: one pass of the unmasked sentence, sum of log p(w_t | W) (Salazar et al.'s "
        '"no masking"; a fast, rough stand-in for the PLL)',
    )
    add_options(g, ChainOptions, ["order", "orders", "seed"], unset=True)


def run(args: argparse.Namespace) -> int:
    """`dscore score`: the PLL, with --method chain the chain rule, with --method unmasked one pass per
    sentence; flags of another method are an error."""
    if args.method != "chain" and (args.order, args.orders, args.seed) != (None, None, None):
        raise UserError("--order, --orders and --seed belong to --method chain")
    if args.conditionals and (args.method != "pll" or args.maskless):
        raise UserError("--conditionals saves the PLL's conditionals: it goes with --method pll and --model only")
    if args.variant != "original" and (args.method == "unmasked" or args.maskless):
        raise UserError(
            "--variant chooses the PLL's masking; one pass of the unmasked sentence (--method unmasked, "
            "--maskless) masks nothing: drop it"
        )
    if args.method == "pll":
        return _pll(args)
    if student_folder(args):
        raise UserError(f"--maskless predicts PLLs; it does not go with --method {args.method}")
    if args.method == "unmasked":
        from ..workflows.maskless import score_unmasked

        return finish(args, score_unmasked(run_config(args), ray_options(args), overwrite=args.overwrite))
    from ..workflows.chain import ChainOptions, score_chain

    options = options_from(args, ChainOptions, split_chars=args.split_chars)
    return finish(args, score_chain(run_config(args), options, ray_options(args), overwrite=args.overwrite))
