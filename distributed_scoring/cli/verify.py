"""`dscore verify`: check an output folder against what its `_run.json` says it holds."""

from __future__ import annotations

import argparse

from .common import finish


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", metavar="DIR", help="the command's --output folder (local path or URI)")


def run(args: argparse.Namespace) -> int:
    from ..workflows.verify import report, verify_folder

    result = verify_folder(args.folder)
    return finish(args, report(result), 0 if result.ok else 1)
