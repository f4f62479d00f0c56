"""`dscore infill`: fill the masked spans of each row by beam search, sampling or exact enumeration."""

from __future__ import annotations

import argparse

from .common import Command, add_corpus_arguments, add_options, finish, options_from, prompt_config, ray_options

COMMAND = Command(
    "infill",
    "fill masked spans: standard or HCB beam search, sampling baselines, exact search",
    description="Rows in DIR/rows/*.parquet: {columns} (beams best first). Exit codes: 0 done, 1 rows lost, 2 bad "
    "input or options.",
    workload="infill",
    place=40,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.infill import InfillOptions

    add_corpus_arguments(
        p,
        "texts with the model's mask token once per token to fill (files, folders, globs, URIs)",
        shard_rows=100,
        variant=False,
    )
    add_options(p, InfillOptions, ["answer_column"])
    add_options(p, InfillOptions, skip=["answer_column"])


def run(args: argparse.Namespace) -> int:
    from ..workflows.infill import InfillOptions, infill

    options = options_from(args, InfillOptions)
    return finish(args, infill(prompt_config(args), options, ray_options(args), overwrite=args.overwrite))
