"""The README's main job: pseudo-perplexity of real antibody heavy chains under AntiBERTy.

No English masked LM can be had offline, so the demo scores IMGT germline heavy-chain V genes (human,
mouse) and shuffled human chains with AntiBERTy, fetched from PyPI and cached on first use. The three
groups are three input files, so the summary's per-input figures are the per-group PPPLs: a working
scorer ranks human < mouse < shuffled.

    python examples/antibody_demo.py --output out/demo
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
from pathlib import Path

from distributed_scoring.cli import LOG_FORMAT
from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import demo_corpus
from distributed_scoring.offline.models import fetch_model


def write_corpus(folder: Path, per_group: int) -> list[Path]:
    """One text file per group, one space-separated chain per line."""
    folder.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[str]] = {}
    for row in demo_corpus(per_group):
        groups.setdefault(row["group"], []).append(row["text"])
    paths = []
    for group, texts in groups.items():
        path = folder / f"{group}.txt"
        path.write_text("\n".join(texts) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/demo", help="output folder of the scoring run")
    parser.add_argument("--per-group", type=int, default=8, help="sequences per group")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # the model's download says so, as the run does
    output = Path(args.output)
    inputs = write_corpus(output.with_name(output.name + "-corpus"), args.per_group)
    model = fetch_model("antiberty")
    with contextlib.redirect_stdout(io.StringIO()):  # the summary's JSON is in the folder; the table is printed
        rc = dscore(["score", *map(str, inputs), "--model", str(model), "--output", str(output), *extra])
    if rc != 0:
        return rc
    summary = json.loads((output / "summary.json").read_text())
    print(f"\n{'group':<10} {'chains':>6} {'residues':>8} {'PPPL':>7} {'PLL/residue':>12}")
    for name, s in summary["by_input"].items():
        mean = s["sum_pll"] / s["n_tokens"]
        print(f"{Path(name).stem:<10} {s['ok']:>6} {s['n_tokens']:>8} {s['pppl_token']:>7.2f} {mean:>12.3f}")
    print(f"{'all':<10} {summary['ok']:>6} {summary['n_tokens']:>8} {summary['pppl_token']:>7.2f}")
    print(f"\nscored rows: {output / 'rows'}  summary (all figures, as JSON): {output / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
