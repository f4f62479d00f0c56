"""`dscore infill`: fill the masked spans of each row by beam search, sampling or exact enumeration."""

from __future__ import annotations

import argparse

from .common import add_corpus_arguments, add_vocab_restrict, finish, prompt_config, ray_options, vocabulary


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.infill import INFILL_DECODERS, INFILL_ORDERS, InfillOptions

    d = InfillOptions()
    add_corpus_arguments(
        p,
        "texts with the model's mask token once per token to fill (files, folders, globs, URIs)",
        shard_rows=100,
        variant=False,
    )
    p.add_argument(
        "--answer-column",
        default=d.answer_column,
        help="column with the true fill, tokens separated by spaces, for accuracy and BLEU (optional)",
    )
    p.add_argument(
        "--decoder",
        choices=INFILL_DECODERS,
        default=d.decoder,
        help="standard or hcb beam search, exact enumeration, or a sampling baseline (default standard)",
    )
    p.add_argument("--order", choices=INFILL_ORDERS, default=d.order, help="fill order (default l2r)")
    p.add_argument("--beam", type=int, default=d.beam, help=f"beam width, or chains of a sampler (default {d.beam})")
    p.add_argument("--top", type=int, default=d.top, help="fills written per row, best first (default: --beam of them)")
    add_vocab_restrict(
        p,
        "the only tokens a fill may use, space-separated, as the tokenizer writes them or as they "
        'read (e.g. the 20 amino acids "A C D ...")',
    )
    p.add_argument("--pivot", default=None, help="HCB pivot token (default: the mask token)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="temperature sampler's T (default 1)")
    p.add_argument(
        "--sample-top-k", type=int, default=d.sample_top_k, help=f"top-k sampler's k (default {d.sample_top_k})"
    )
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"nucleus sampler's p (default {d.top_p})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the samplers (with each row's id)")
    p.add_argument(
        "--max-masks",
        type=int,
        default=d.max_masks,
        help=f"rows with more mask tokens are error rows (default {d.max_masks})",
    )
    p.add_argument(
        "--exact-limit",
        type=int,
        default=d.exact_limit,
        help=f"most fills `exact` enumerates per row, |V|^masks (default {d.exact_limit:,})",
    )
    p.add_argument("--rescore-pll", action="store_true", help="also write the PLL of each written fill")


def run(args: argparse.Namespace) -> int:
    from ..workflows.infill import InfillOptions, infill

    options = InfillOptions(
        args.decoder,
        args.order,
        args.beam,
        args.top,
        vocabulary(args),
        args.pivot,
        args.temperature,
        args.sample_top_k,
        args.top_p,
        args.seed,
        args.max_masks,
        args.exact_limit,
        args.rescore_pll,
        args.answer_column,
    )
    return finish(args, infill(prompt_config(args), options, ray_options(args), overwrite=args.overwrite))
