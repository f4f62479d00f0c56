"""`dscore`: thin commands that parse, call one library function and print its result.

A command is one module of this package exposing `add_arguments(parser)`, `run(args) -> int` (the exit
code) and its registry entry, `COMMAND`, which `COMMANDS` gathers; flags that several commands take are
declared once in `common`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from typing import NoReturn, Sequence

from ..cpus import thread_env
from ..errors import DataLossError, UserError, error_reason, storage_cause
from ..quiet import quiet_transformers
from ..stopping import Stopped, stopping_on_signals
from .common import add_commands, add_verbose, discovered, dispatch, environment, storage_environment

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # every command's log lines on standard error

COMMANDS = discovered(sys.modules[__name__])  # every module of this package that declares its COMMAND


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dscore", description="Masked-LM scoring: PLL and pseudo-perplexity")
    add_verbose(parser)
    add_commands(parser, COMMANDS, dest="command")
    return parser


def job_main(command: str, argv: Sequence[str] | None = None) -> int:
    """The jobs/ scripts' entry: `dscore job COMMAND` with the script's arguments."""
    return main(["job", command, *(sys.argv[1:] if argv is None else argv)])


def _one_line(exc: Exception) -> str:
    """The message on one line: a library's message quoted in ours (transformers', pyarrow's) may span several."""
    return re.sub(r"\s*\n\s*", " ", str(exc).strip())


def _stopped(stop: Stopped, args: argparse.Namespace) -> NoReturn:
    """Print the stop's line (while the signals are still handled: a repeat must not end the process unsaid)
    and exit at once: the run has unwound (its lock released, its files closed), and what an interpreter's
    shutdown would still do could only outlast the grace or break the line's promise (an embedded Ray's
    shutdown waits on processes a group kill has ended; a stopped in-process rescore's teardown aborted,
    `terminate called without an active exception`, exit -6)."""
    stop.tell()
    args.result.flush()
    logging.shutdown()
    os._exit(stop.exit_code)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if getattr(args, "verbose", False):  # which object-store endpoint a run uses (io.storage)
        logging.getLogger("distributed_scoring.io.storage").setLevel(logging.DEBUG)
    quiet_transformers()
    os.environ.update(thread_env())  # before torch starts: OpenMP reads its wait policy once
    # Standard output carries the command's result alone (JSON that scripts parse); while a command runs,
    # anything else printed there (Ray streams its workers' and raylets' messages to stdout) goes to stderr.
    args.result = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            with environment(storage_environment(args)), stopping_on_signals():
                try:
                    return dispatch(COMMANDS, args.command, args)
                except Stopped as stop:  # SIGTERM or Ctrl-C: the run unwound (lock released)
                    return _stopped(stop, args)
        except UserError as exc:
            print(f"dscore: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        except DataLossError as exc:
            print(f"dscore: incomplete: {_one_line(exc)}", file=sys.stderr)
            return 1
        except OSError as exc:  # storage that cannot be used before the run (a run's own become DataLossError)
            print(f"dscore: error: {storage_cause(exc)} ({_one_line(error_reason(exc))})", file=sys.stderr)
            return 2
