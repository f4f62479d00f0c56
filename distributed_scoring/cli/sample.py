"""`dscore sample`: Metropolis-Hastings (and Gibbs) chains from an MLM's energy, proposals from the MLM."""

from __future__ import annotations

import argparse

from .common import Command, add_corpus_arguments, add_options, finish, options_from, prompt_config, ray_options

COMMAND = Command(
    "sample",
    "sample from an MLM's energy: Metropolis-Hastings with MLM proposals (and Gibbs)",
    description="Rows in DIR/rows/*.parquet, one per chain per recorded epoch: {columns}. Exit codes: 0 done, 1 rows "
    "lost, 2 bad input or options.",
    workload="sample",
    place=50,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.sample import SampleOptions

    add_corpus_arguments(
        p,
        "texts with the model's mask token at the positions to sample (or any text with --free-all)",
        shard_rows=50,
        variant=False,
    )
    add_options(p, SampleOptions, ["answer_column"])
    add_options(p, SampleOptions, skip=["answer_column", "vocab_restrict"])
    add_options(p, SampleOptions, ["vocab_restrict"])


def run(args: argparse.Namespace) -> int:
    from ..workflows.sample import SampleOptions, sample

    options = options_from(args, SampleOptions)
    return finish(args, sample(prompt_config(args), options, ray_options(args), overwrite=args.overwrite))
