"""`dscore generate`: u-PMLM's any-order generation (Algorithm 1), greedy or sampled, from prompts or
from nothing."""

from __future__ import annotations

import argparse

from .common import (
    Command,
    add_corpus_arguments,
    add_options,
    finish,
    model_spec,
    options_from,
    ray_options,
    shard_rows,
)

COMMAND = Command(
    "generate",
    "generate in any order with a masked LM (u-PMLM Algorithm 1): greedy or sampled, constrained "
    "by the prompt's tokens",
    description="Rows in DIR/rows/*.parquet, one per generated sequence: {columns} (log_likelihood: the chain rule "
    "along fill_order, natural log). Exit codes: 0 done, 1 rows lost, 2 bad input or options.",
    workload="generate",
    place=60,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.generate import GenerateOptions

    add_corpus_arguments(
        p,
        "prompts: texts with the model's mask token at each token to generate (the other "
        "tokens stay); or none, with --length",
        nargs="*",
        shard_rows=100,
        variant=False,
        fit_actors=False,
    )
    add_options(
        p,
        GenerateOptions,
        ["length", "sequences", "order", "order_column", "temperature", "top_k", "top_p", "seed", "vocab_restrict"],
    )


def run(args: argparse.Namespace) -> int:
    from ..workflows.generate import GenerateInputs, GenerateOptions, generate

    options = options_from(args, GenerateOptions)
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
