"""Running the CLI in a test and reading its refusal."""

from __future__ import annotations

from distributed_scoring.cli import main


def refusal(capsys, args: list[str]) -> str:
    """The command's one `dscore: ` line, after checking it exited 2 without a traceback (other log lines
    may come before it)."""
    capsys.readouterr()
    rc = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    return lines[0]
