"""`dscore submit`: a dscore command or jobs/ script as a Ray job, exiting with the job's own exit code."""

from __future__ import annotations

import argparse

from .common import Command

COMMAND = Command(
    "submit",
    "run a dscore command or jobs/ script as a Ray job; exits with its exit code",
    description="Submits through Ray's job SDK (token auth from $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or "
    "~/.ray/auth_token), writes the job's log to standard output as it comes, and exits with the "
    "entrypoint's own code (0 pass, 3 regression, 5 insufficient data, 2 bad input, ...), which `ray job "
    "submit` does not. Exit codes: the entrypoint's; 2 no job server answers or it refuses the job; 1 the "
    "job ended without a code of its own (stopped, its driver lost) or the job server was lost meanwhile.",
    place=110,
)


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
