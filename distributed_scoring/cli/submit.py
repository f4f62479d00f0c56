"""`dscore submit`: a dscore command or jobs/ script as a Ray job, exiting with the job's own exit code."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        default=None,
        help="the job server, http://HEAD:8265 (default $RAY_API_SERVER_ADDRESS, then $RAY_ADDRESS)",
    )
    p.add_argument(
        "--working-dir",
        default=None,
        metavar="DIR",
        help="folder uploaded as the job's working directory and put on its PYTHONPATH (`.` for "
        "this repository, which jobs/ scripts need where the package is not installed)",
    )
    p.add_argument(
        "entrypoint",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="what the job runs: `python jobs/pppl_audit.py --input ...` or `dscore audit ... --ray`",
    )


def run(args: argparse.Namespace) -> int:
    from ..workflows.submit import Submission, submit

    words = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    return submit(Submission(tuple(words), args.address, args.working_dir), args.result, args.verbose)
