"""`dscore fetch-model`: download and convert an offline model, print its folder."""

from __future__ import annotations

import argparse

from .common import Command, finish

COMMAND = Command(
    "fetch-model",
    "download and convert an offline model; prints its folder",
    place=130,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..offline.models import MODELS

    p.add_argument("name", choices=sorted(MODELS))
    p.add_argument(
        "--cache", default=None, help="cache folder (default: $DSCORE_CACHE or ~/.cache/distributed-scoring)"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..offline.models import fetch_model

    return finish(args, str(fetch_model(args.name, Path(args.cache) if args.cache else None)))
