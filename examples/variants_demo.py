"""Variant-effect demo on real weights: every single mutant of a human germline V gene, by four strategies.

The 19 x L single substitutions of IGHV3-23*01 (IMGT germline, the most used human heavy V gene) are
written as a ProteinGym-style table (`mutant`, `mutated_sequence`; no measurements: nothing to fit) and
scored by `dscore variants` with AntiBERTy and Sapiens (VH), each by the four strategies of Meier et al.
(2021). The printed tables are what each run cost (variants, forward passes, seconds) and, per model, the
Spearman correlation between every two strategies' scores, joined by `mutant`.

Cost (L = 98): the marginals take 1, L and 19 x L passes (the wild type; each position of it masked; each
mutant), seconds to minutes on 2 CPU cores. `pll` takes L masked copies of each of the 19 x L + 1 sequences,
182,574 passes of 100 tokens: about 10 minutes with Sapiens, but 3 to 5 hours with AntiBERTy (10 to 15
passes a second on 2 shared cores). `--strategies` leaves it out; `--limit N` scores the first N variants
(N / 19 positions) for a quick check (the numbers in docs/variants.md).

    python examples/variants_demo.py --output out/variants-demo [--models antiberty sapiens-vh]
        [--strategies wt-marginal masked-marginal mutant-marginal pll] [--limit N] [--ray] [--overwrite]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from distributed_scoring.cli import LOG_FORMAT
from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import v_genes
from distributed_scoring.offline.models import fetch_model
from distributed_scoring.workflows.variants.stats import spearman

GENE = "IGHV3-23*01"
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
STRATEGIES = ("wt-marginal", "masked-marginal", "mutant-marginal", "pll")
MODELS = ("antiberty", "sapiens-vh")


def singles(wild_type: str) -> list[tuple[str, str]]:
    """(mutant, mutated_sequence) of every single substitution, by position then residue (1-based, ProteinGym's)."""
    rows = []
    for i, wild in enumerate(wild_type):
        for new in AMINO_ACIDS:
            if new != wild:
                rows.append((f"{wild}{i + 1}{new}", wild_type[:i] + new + wild_type[i + 1 :]))
    return rows


def write_table(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mutant", "mutated_sequence"])
        writer.writerows(rows)
    return path


def run_one(table: Path, wild_type: str, model: Path, strategy: str, output: Path, extra: list[str]) -> dict:
    """One `dscore variants` run; its summary, the wall seconds and the scores by mutant (None where an error row)."""
    began = time.monotonic()
    argv = ["variants", str(table), "--target-seq", wild_type, "--model", str(model), "--strategy", strategy]
    with contextlib.redirect_stdout(io.StringIO()):  # the summary's JSON is in the folder; the tables are printed
        rc = dscore([*argv, "--output", str(output), *extra])
    if rc != 0:
        raise SystemExit(f"dscore variants exited {rc} for {strategy} into {output}")
    wall = time.monotonic() - began
    summary = json.loads((output / "summary.json").read_text())
    rows = pq.read_table(output / "variants.parquet", columns=["mutant", "score"]).to_pylist()
    return {"summary": summary, "wall": wall, "scores": {r["mutant"]: r["score"] for r in rows}}


def agreement(runs: dict[str, dict]) -> tuple[list[str], np.ndarray, int]:
    """Spearman between every two strategies' scores over the mutants both scored (joined by name), and the
    fewest mutants any pair shared."""
    names = list(runs)
    rho, fewest = np.full((len(names), len(names)), np.nan), None
    for a, first in enumerate(names):
        for b, second in enumerate(names):
            x, y = runs[first]["scores"], runs[second]["scores"]
            both = sorted(m for m in x.keys() & y.keys() if x[m] is not None and y[m] is not None)
            value = spearman(np.asarray([x[m] for m in both]), np.asarray([y[m] for m in both]))
            rho[a, b] = np.nan if value is None else value
            fewest = len(both) if fewest is None else min(fewest, len(both))
    return names, rho, fewest or 0


def print_tables(results: dict[str, dict[str, dict]], gene: str, length: int) -> None:
    print(f"\n{gene}, L = {length}\n")
    print("| model | strategy | variants | scored | forward passes | seconds | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, runs in results.items():
        for strategy, r in runs.items():
            s = r["summary"]
            print(
                f"| {model} | {strategy} | {s['variants']} | {s['ok']} | {s['forward_passes']:,} "
                f"| {s['seconds']:.1f} | {r['wall']:.1f} |"
            )
    for model, runs in results.items():
        names, rho, shared = agreement(runs)
        print(f"\n{model}: Spearman between strategies ({shared} variants scored by every pair)\n")
        print("| | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        for name, row in zip(names, rho):
            print(f"| {name} | " + " | ".join("-" if np.isnan(v) else f"{v:.3f}" for v in row) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/variants-demo", help="one run per model and strategy under it")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="offline models")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--limit", type=int, default=None, help="score the first N variants only (a quick check)")
    parser.add_argument("--ray", action="store_true", help="score on Ray actors (embedded local Ray)")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier runs (another --limit, say)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit {args.limit}: give at least 1 variant")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # the models' downloads say so, as the runs do
    wild_type = v_genes("human")[GENE]
    rows = singles(wild_type)[: args.limit]
    output = Path(args.output)
    table = write_table(output.with_name(output.name + "-table") / f"{GENE.replace('*', '_')}.csv", rows)
    extra = [*(["--ray"] if args.ray else []), *(["--overwrite"] if args.overwrite else [])]
    results: dict[str, dict[str, dict]] = {}
    for name in args.models:
        model = fetch_model(name)
        for strategy in args.strategies:
            results.setdefault(name, {})[strategy] = run_one(
                table, wild_type, model, strategy, output / name / strategy, extra
            )
    print_tables(results, GENE, len(wild_type))
    print(f"\nruns (variants.parquet, summary.json, report.md each): {output}/<model>/<strategy>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
