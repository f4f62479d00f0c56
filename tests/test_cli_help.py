"""`--help` of `dscore` and of every command and subcommand, compared with the texts kept in
tests/data/cli_help/ (one file per command, `train-maskless.txt` for `dscore train maskless`): flags,
help texts, defaults shown and exit codes described stay as they are unless a snapshot is rewritten on
purpose. `defaults.json` holds every flag's default, which --help does not always show. After a deliberate
change, rewrite them with

    python tests/test_cli_help.py --write

and review the diff. The width is fixed (COLUMNS=120) so that the terminal does not change the wrapping;
argparse's own layout differs between Python versions, so the texts are those of the project's Python 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest

from distributed_scoring.cli import COMMANDS, build_parser
from distributed_scoring.workloads import registered

SNAPSHOTS = Path(__file__).resolve().parent / "data" / "cli_help"
DEFAULTS = SNAPSHOTS / "defaults.json"
COLUMNS = "120"


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(file stem, parser) for the parser and every subcommand under it, depth first."""
    yield "-".join(words) or "dscore", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name))


def help_texts() -> dict[str, str]:
    """File stem -> `--help` text at the fixed width, for the whole command tree."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS  # argparse reads the width when each formatter is made
    try:
        return {stem: parser.format_help() for stem, parser in _commands(build_parser())}
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def defaults() -> dict[str, dict[str, str]]:
    """File stem -> {flag (or positional): repr of its default} for the whole command tree."""
    return {
        stem: {
            (action.option_strings or [action.dest])[0]: repr(action.default)
            for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        }
        for stem, parser in _commands(build_parser())
    }


def test_every_command_has_a_snapshot_and_every_snapshot_a_command():
    assert sorted(help_texts()) == sorted(p.stem for p in SNAPSHOTS.glob("*.txt"))


@pytest.mark.parametrize("stem", sorted(p.stem for p in SNAPSHOTS.glob("*.txt")))
def test_help_is_unchanged(stem):
    assert help_texts().get(stem) == (SNAPSHOTS / f"{stem}.txt").read_text()


def test_defaults_are_unchanged():
    assert defaults() == json.loads(DEFAULTS.read_text())


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.workload], ids=lambda c: c.name)
def test_a_commands_help_lists_the_columns_its_workload_writes(command):
    """Every column of the workload's declared schema, in order, and nothing between them but a struct's
    fields: the list cannot drift from the rows."""
    names = registered()[command.workload].output().names
    listed = re.sub(r" \([^)]*\)", "", " ".join(command.text().split()))  # struct fields and remarks out
    assert ", ".join(names) in listed


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SNAPSHOTS.glob("*.txt"):
        old.unlink()
    for stem, text in help_texts().items():
        (SNAPSHOTS / f"{stem}.txt").write_text(text)
    DEFAULTS.write_text(json.dumps(defaults(), indent=1) + "\n")
