"""`dscore verify`: check an output folder against what its `_run.json` says it holds."""

from __future__ import annotations

import argparse

from .common import Command, finish

COMMAND = Command(
    "verify",
    "check an output folder: every planned shard done, markers against files, ids once, "
    "summary there and agreeing, no leftovers",
    description="Prints one line per problem, per missing part and per thing it could not check, then OK, "
    "INCOMPLETE (rerun the same command to finish) or FAILED (damaged). Folders of rescore, joints and train "
    "are verified through the runs inside them. Exit codes: 0 complete and sound, 1 incomplete or damaged, "
    "2 not a dscore output folder.",
    place=80,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", metavar="DIR", help="the command's --output folder (local path or URI)")


def run(args: argparse.Namespace) -> int:
    from ..workflows.verify import report, verify_folder

    result = verify_folder(args.folder)
    return finish(args, report(result), 0 if result.ok else 1)
