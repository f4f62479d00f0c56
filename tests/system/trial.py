"""The adversarial trial: an operator who feeds `dscore` bad inputs, kills it, damages its folders, makes
every operator mistake docs/runs.md refuses and tries a few attacks, one case at a time, against the real
CLI; one table row per case, judged against what docs/runs.md promises.

    .venv/bin/python tests/system/trial.py --output out/adversarial [--update docs/reliability.md]
    .venv/bin/python tests/system/trial.py --output out/adversarial --only F0 --only O01   # some cases

The cases are in tests/helpers/trial (one module per category), and are also the system tests of this folder
(`pytest -m system tests/system`, each asserting its case's PASS). Every case works in a folder of its own
under `--output`, with tiny random models built there (no downloads). Writes `adversarial.json` (every case
with what it observed) and `adversarial.md` (the table) under `--output`; `--update PAGE` writes the page
docs/reliability.md (how to run it, counts, the table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helper package, as pytest has it

from helpers.trial.dscore import set_environment  # noqa: E402

set_environment()  # before torch is imported

from helpers.trial.play import run_trial, select  # noqa: E402
from helpers.trial.report import counts, counts_table, git_commit, markdown_table, page  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", required=True, help="folder of the cases' folders, adversarial.json and .md")
    parser.add_argument("--update", default=None, help="write this page (docs/reliability.md) with the table")
    parser.add_argument("--only", action="append", default=[], help="cases whose id starts with this (repeatable)")
    parser.add_argument("--spawn", action="store_true", help="every command as `python -m distributed_scoring.cli`")
    parser.add_argument("--no-ray", action="store_true", help="leave out the cases that start an embedded Ray")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = select(args.only, not args.no_ray)
    if args.list:
        for c in cases:
            print(f"{c.id}  {c.category:16}  {c.what}")
        return 0
    root = Path(args.output).resolve()
    load = os.getloadavg()[0]
    started = time.monotonic()
    mode = "spawn" if args.spawn else "fork"
    results = run_trial(root, cases, mode)
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cases": len(results),
        "minutes": (time.monotonic() - started) / 60,
        "load": load,
        "cores": os.cpu_count(),
        "mode": mode,
        "commit": git_commit(),
    }
    (root / "adversarial.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "counts": {k: dict(v) for k, v in counts(results).items()},
                "cases": [
                    {
                        **{k: v for k, v in asdict(r).items() if k != "outcome"},
                        **asdict(r.outcome),
                        "verdict": r.verdict,
                    }
                    for r in results
                ],
            },
            indent=1,
        )
    )
    (root / "adversarial.md").write_text(counts_table(results) + "\n" + markdown_table(results))
    if args.update:
        Path(args.update).write_text(page(results, meta))
    print(counts_table(results))
    return 0 if all(r.verdict == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
