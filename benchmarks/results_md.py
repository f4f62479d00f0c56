"""Writing a harness's Markdown table into its marked section of RESULTS.md, and its raw numbers."""

from __future__ import annotations

import json
from pathlib import Path

RAW = Path(__file__).parent / "results"


def update_section(path: Path, name: str, table: str, writer: str) -> None:
    """Replace what stands between `<!-- BEGIN name ... -->` and `<!-- END name -->` with `table`."""
    begin, end = f"<!-- BEGIN {name} (written by {writer}) -->", f"<!-- END {name} -->"
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path} lacks the markers {begin!r} ... {end!r}; add them where the table goes")
    head, rest = text.split(begin, 1)
    path.write_text(head + begin + "\n" + table + end + rest.split(end, 1)[1])


def save_raw(name: str, raw: dict) -> Path:
    """Write a harness's raw numbers (every round, the machine) to benchmarks/results/<name>.json."""
    RAW.mkdir(exist_ok=True)
    path = RAW / f"{name}.json"
    path.write_text(json.dumps(raw, indent=2))
    return path
