"""The adversarial trial's report: counts per category, the table of every case, and the page
docs/reliability.md (written by tests/system/trial.py --update)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Sequence

from helpers.trial.cases import CATEGORIES
from helpers.trial.play import Result

ROOT = Path(__file__).resolve().parents[3]


def counts(results: Sequence[Result]) -> dict[str, Counter]:
    table = {category: Counter() for category in CATEGORIES}
    for r in results:
        table[r.category][r.verdict] += 1
    return table


def _cell(text: object, limit: int = 220) -> str:
    text = "" if text is None else str(text)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


COLUMNS = (
    "case",
    "category",
    "what was done",
    "command",
    "expected",
    "exit",
    "the dscore line",
    "traceback",
    "rows in / out",
    "repeated ids",
    "verify after",
    "verdict",
)


def markdown_table(results: Sequence[Result]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        o = r.outcome
        rows = "-" if o.rows_in is None and o.rows_out is None else f"{_none(o.rows_in)} / {_none(o.rows_out)}"
        what = r.what + (f" ({o.done})" if o.done else "")
        verdict = r.verdict + (": " + "; ".join(o.problems) if o.problems else "")
        cells = [
            r.id,
            r.category,
            what,
            f"`{_cell(o.command, 160)}`" if o.command else "",
            r.expected,
            _none(o.rc, "killed"),
            _cell(o.line),
            "yes" if o.traceback else "no",
            rows,
            _none(o.duplicates),
            o.verdict,
            verdict,
        ]
        lines.append("| " + " | ".join(_cell(c, 400) if i not in (3,) else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines) + "\n"


def _none(value: object, instead: str = "-") -> str:
    return instead if value is None else str(value)


def verdict_line(fails: list) -> str:
    """The report's one line on failures: none, or each failed case with its problems."""
    if not fails:
        return "Every case passed."
    return "Failed: " + ", ".join(f"{r.id} ({'; '.join(r.outcome.problems)})" for r in fails) + "."


def counts_table(results: Sequence[Result]) -> str:
    table = counts(results)
    lines = ["| category | cases | PASS | FAIL |", "|---|---|---|---|"]
    for category, c in table.items():
        lines.append(f"| {category} | {sum(c.values())} | {c['PASS']} | {c['FAIL']} |")
    total = Counter(r.verdict for r in results)
    lines.append(f"| all | {len(results)} | {total['PASS']} | {total['FAIL']} |")
    return "\n".join(lines) + "\n"


def page(results: Sequence[Result], meta: dict) -> str:
    fails = [r for r in results if r.verdict == "FAIL"]
    return f"""# Reliability: the adversarial trial

What [runs.md](runs.md) promises, tried by an operator who means harm or makes mistakes: every bad input
a clear one-line error (exit 2, no traceback) or an error row per bad row (rows in == rows out); every
fault (kill -9, damaged folders, changed inputs, locks, a full disk) survived by rerunning the same
command with rows in == rows out, no repeated id and `dscore verify` OK, and verify not OK on the
damaged folder before; every operator mistake (two runs into one folder, an `--output` that is an input
or an empty string, a folder of your own files, a copied shard, an `--overwrite` where your own files or
another command's run lie) refused in one line or survived with nothing mixed; a few attacks.
`tests/system/trial.py` plays each case against the real CLI with tiny random models (nothing
downloaded) and judges what it sees; a FAIL is a promise broken, and stays in the table until the code
is fixed. The same cases are system tests, one file per category in `tests/system/` (the cases themselves
in `tests/helpers/trial/`), each asserting its case's PASS; `make test` runs them.

```bash
.venv/bin/python tests/system/trial.py --output out/adversarial --update docs/reliability.md
.venv/bin/python tests/system/trial.py --output out/adversarial --only F0 --only O12   # some cases
.venv/bin/python -m pytest -m system tests/system   # the same cases as tests
```

`--spawn` runs every command as `python -m distributed_scoring.cli` (by default each is forked from the
trial after the imports; the `--ray` cases always spawn), `--no-ray` leaves the Ray cases out. Each case's
folder, with the commands' standard output and error (`<case>/_logs`), stays under `--output`.

Last run: {meta["cases"]} cases, commands {meta["mode"]}ed; the trial's `adversarial.json` records when, on
what machine and at which commit it ran.

{counts_table(results)}
{verdict_line(fails)}

Columns: the command judged (paths relative to the case's folder; `../_models/bert` is a tiny random BERT),
its exit code (`killed`: kill -9 by the trial), its `dscore` line(s) on standard error, whether a Python
traceback was printed, the rows the input holds and the rows of the folder's marked shards (what dscore's
readers read), the ids among them that repeat, and `dscore verify`'s verdict on the folder afterwards.

{markdown_table(results)}"""


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
