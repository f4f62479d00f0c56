"""`dscore job COMMAND ...`: any scoring command as the entry point of a Ray job (`ray job submit -- dscore job
score --input ... --output s3://...`), so that a new command needs no script of its own under jobs/ (the
scripts there run this too)."""

from __future__ import annotations

import argparse
import os

from ..errors import UserError
from .common import Command, dispatch, environment, storage_environment

COMMAND = Command(
    "job",
    "run a command as a Ray job's entry point: `ray job submit -- dscore job score --input ...`",
    description="Runs COMMAND through Ray, joining the cluster that RAY_ADDRESS names inside a job (as --ray does), "
    "with --input flags (repeatable) as its inputs. A relative --output is refused: inside a job it would "
    "land in the job's temporary working directory on each node. The jobs/ scripts do the same. Exit codes: "
    "COMMAND's.",
    place=120,
)


NOT_JOBS = ("job", "submit", "verify", "fetch-model", "history")  # they start no run on a cluster


def add_arguments(p: argparse.ArgumentParser) -> None:
    from . import COMMANDS

    jobs = [c.name for c in COMMANDS if c.name not in NOT_JOBS]
    p.add_argument("job", choices=jobs, metavar="COMMAND", help=f"the command to run: {', '.join(jobs)}")
    p.add_argument(
        "arguments",
        nargs=argparse.REMAINDER,
        metavar="...",
        help="COMMAND's own flags, its inputs as --input (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the job's command, parsed by the whole CLI's parser."""
    from . import COMMANDS, build_parser

    parser = build_parser()
    command, unknown = parser.parse_known_args(job_arguments(parser, args.job, args.arguments))
    if unknown:  # the command's usage, not the whole CLI's: the jobs/ scripts are that command
        inputs = "; in a job its INPUTs are --input flags" if _inputs_of(parser, args.job) is not None else ""
        _innermost(parser, command).error(f"unrecognized arguments: {' '.join(unknown)}{inputs}")
    command.result = args.result
    with environment(storage_environment(command)):
        return dispatch(COMMANDS, command.command, command)


def job_arguments(parser: argparse.ArgumentParser, command: str, argv: list[str]) -> list[str]:
    """The command line a job runs: through Ray, joining the cluster that RAY_ADDRESS names inside a job. A
    command that reads INPUT positionals takes them as `--input` flags (repeatable), needed unless it may run
    without inputs (`generate --length`).

    A relative `--output` is refused: inside a job it would name a folder in the job's temporary working
    directory, a different one on every node, deleted when the job ends.
    """
    positional = _inputs_of(parser, command)
    if positional is not None:
        parser = argparse.ArgumentParser(prog=f"dscore job {command}", add_help=False)
        parser.add_argument(
            "--input",
            action="append",
            default=[],
            required=positional.nargs == "+",
            help="file, folder, glob or URI (repeatable)",
        )
        given, rest = parser.parse_known_args(argv)
        argv = [*given.input, *rest]
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--output")
    folder = output.parse_known_args(argv)[0].output
    if folder and "://" not in folder and not os.path.isabs(folder):
        raise UserError(
            f"--output {folder!r} is relative; in a Ray job it would land in the job's temporary working directory "
            "on each node: pass an absolute path on storage every node shares, or an s3:// / gs:// URI"
        )
    return [command, *argv, "--ray"]


def _innermost(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `namespace` was parsed into: `dscore audit`'s, `dscore train maskless`'s."""
    while (found := next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)) is not None:
        chosen = getattr(namespace, found.dest, None)
        if chosen not in found.choices:
            break
        parser = found.choices[chosen]
    return parser


def _inputs_of(parser: argparse.ArgumentParser, command: str) -> argparse.Action | None:
    """The INPUT positional of `command` (a subcommand of the CLI's `parser`), or None when it has none."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return next((a for a in commands[command]._actions if a.dest == "inputs"), None)
