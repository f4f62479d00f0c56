"""`dscore generate`: u-PMLM's any-order generation (Algorithm 1), greedy or sampled, from prompts or
from nothing."""

from __future__ import annotations

import argparse

from .common import add_corpus_arguments, add_vocab_restrict, finish, model_spec, ray_options, shard_rows, vocabulary


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.generate import GENERATION_ORDERS, GenerateOptions

    d = GenerateOptions()
    add_corpus_arguments(
        p,
        "prompts: texts with the model's mask token at each token to generate (the other "
        "tokens stay); or none, with --length",
        nargs="*",
        shard_rows=100,
        variant=False,
        fit_actors=False,
    )
    p.add_argument("--length", type=int, default=None, help="no INPUTS: generate sequences of this many tokens")
    p.add_argument(
        "--num-sequences",
        type=int,
        default=d.sequences,
        help="sequences per prompt; with --length, how many sequences (default 1)",
    )
    p.add_argument(
        "--order",
        choices=GENERATION_ORDERS,
        default=d.order,
        help="fill order: random (default; seeded per sequence), l2r, r2l, or given per row",
    )
    p.add_argument(
        "--order-column",
        default=d.order_column,
        help="with --order given: the column listing the masks' indices (0 .. k-1, in reading order) in "
        'fill order, as a JSON list or "2 0 1" (default: fill_order, as the output writes it)',
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help="sampling temperature; 0: greedy, the most probable token at each step (default 1)",
    )
    p.add_argument(
        "--top-k", type=int, default=d.top_k, help="sample among the k most probable tokens (default 0: off)"
    )
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus sampling's p (default 1: off)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the orders and samples (with each row's id)")
    add_vocab_restrict(p, "the only tokens that may be generated, space-separated (as in dscore infill)")


def run(args: argparse.Namespace) -> int:
    from ..workflows.generate import GenerateInputs, GenerateOptions, generate

    options = GenerateOptions(
        args.order,
        args.num_sequences,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        vocabulary(args),
        args.length,
        args.order_column,
    )
    inputs = GenerateInputs(
        tuple(args.inputs),
        args.output,
        args.text_column,
        args.id_column,
        shard_rows(args),
        args.batch_tokens,
        args.allow_duplicate_ids,
    )
    return finish(args, generate(inputs, model_spec(args), options, ray_options(args), overwrite=args.overwrite))
