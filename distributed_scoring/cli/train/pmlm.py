"""`dscore train pmlm`: continue training a masked LM with the u-PMLM objective."""

from __future__ import annotations

import argparse

from ...config import ModelSpec
from ..common import add_id_arguments, add_text_column, finish
from .common import add_train_arguments, train_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...workflows.train.pmlm import LR

    p.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="CORPUS",
        help="training texts: files, folders or globs as `dscore score` reads them",
    )
    add_text_column(p)
    add_id_arguments(p, "column or JSON field holding a row id, which the held-out split hashes (default: file:line)")
    p.add_argument(
        "--split-chars",
        action="store_true",
        help="a space between characters before tokenising (per-residue models; see dscore score)",
    )
    p.add_argument(
        "--orders",
        type=int,
        default=1,
        help="random orders per held-out row for the random-order perplexity (default 1)",
    )
    add_train_arguments(p, lr=LR)


def run(args: argparse.Namespace) -> int:
    from ...workflows.train.pmlm import read_corpus, train_pmlm

    options, resources = train_options(args)
    model = ModelSpec(args.model, args.revision, trust_remote_code=args.trust_remote_code)
    corpus = read_corpus(tuple(args.data), args.text_column, args.id_column, args.split_chars, args.allow_duplicate_ids)
    report = train_pmlm(corpus, model, args.output, options, resources, args.overwrite, args.batch_tokens, args.orders)
    return finish(args, report)
