"""The audit history at scale: a year of nights x 500 partitions, read and judged.

Builds a synthetic history (`HIST/<night>.parquet` in the product's schema, figures drawn around fixed levels)
of N nights x P partitions, then times, each in a fresh process so that its peak memory is its own:

- judge: one new night of P partitions (its rows' figures included) against the history, then appended, as
  `dscore audit --history` does after scoring;
- read: `dscore history` reading every night back, its table and trend.html.

Usage: python benchmarks/history_scale.py [--nights 365] [--partitions 500] [--out out/history-bench]
Prints one JSON line per measurement: seconds and the process's peak RSS (MB), at 1/4 of the nights and at all
of them, to show that memory does not grow with the nights judged.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROWS_PER_PARTITION = 100


def build(folder: Path, nights: int, partitions: int, seed: int = 0) -> None:
    """A history of `nights` nights written directly in the product's schema."""
    from distributed_scoring.workflows.audit.history import HISTORY_SCHEMA, QUANTILE_COLUMNS, History

    rng = np.random.default_rng(seed)
    history = History(str(folder))
    level = rng.uniform(1.5, 3.0, partitions)  # (P,) each partition's NLL per token
    names = [f"part-{i:03d}" for i in range(partitions)]
    for n in range(nights):
        night = f"night-{n + 1:04d}"
        nll = level + rng.normal(0, 0.01, partitions)
        rows = [
            {
                "night": night,
                "created": "2026-01-01T00:00:00+00:00",
                "segment": "night-0001",
                "scorer": "bench",
                "scorer_signature": "{}",
                "metric": "pppl_token",
                "scope": name,
                "rows": ROWS_PER_PARTITION,
                "ok": ROWS_PER_PARTITION,
                "errors": 0,
                "pppl_token": float(np.exp(x)),
                "error_rate": 0.0,
                "log_pppl_se": 0.01,
                **{c: float(x + q) for c, q in zip(QUANTILE_COLUMNS, np.linspace(-0.5, 0.5, len(QUANTILE_COLUMNS)))},
                "histogram": [0] * 52,
                "series_status": "no change",
                "verdict": "pass",
                "exit_code": 0,
            }
            for name, x in zip(["(overall)", *names], [float(nll.mean()), *nll])
        ]
        history.append(night, pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA))


def judge(folder: Path, nights: int, partitions: int) -> None:
    """One new night against the history: what `dscore audit --history` adds to an audit."""
    from distributed_scoring.io import schema as S
    from distributed_scoring.workflows.audit.history import History
    from distributed_scoring.workflows.audit.nightly import Tonight, judge_night
    from distributed_scoring.workflows.audit.records import ScopeFigures
    from distributed_scoring.workflows.audit.series import SeriesRules
    from distributed_scoring.workflows.audit.verdicts import OVERALL, Thresholds

    rng = np.random.default_rng(1)
    names = [f"part-{i:03d}" for i in range(partitions)]
    n = partitions * ROWS_PER_PARTITION
    tokens = rng.integers(10, 40, n)
    pll = -tokens * rng.uniform(1.5, 3.0, n)
    rows = pa.table(
        {
            S.ID: [str(i) for i in range(n)],
            S.PARTITION: np.repeat(names, ROWS_PER_PARTITION),
            "ok": np.ones(n, bool),
            S.PLL: pll,
            S.N_TOKENS: tokens,
            S.N_WORDS: tokens,
        }
    )

    def figures(take: np.ndarray) -> ScopeFigures:
        t, s = int(tokens[take].sum()), float(pll[take].sum())
        return ScopeFigures(len(take), len(take), 0, s, t, t, float(np.exp(-s / t)), float(np.exp(-s / t)), 0.0, 0)

    scopes = {OVERALL: figures(np.arange(n))}
    scopes.update(
        {name: figures(np.arange(i * ROWS_PER_PARTITION, (i + 1) * ROWS_PER_PARTITION)) for i, name in enumerate(names)}
    )
    tonight = Tonight(f"night-{nights + 1:04d}", scopes, {}, rows, {"signature": {}, "weights_digest": None}, None)
    history = History(str(folder))
    record, table = judge_night(history, tonight, Thresholds(), SeriesRules())
    history.append(tonight.night, table)
    assert len(record.scopes) == partitions + 1


def read(folder: Path, out: Path) -> None:
    from distributed_scoring.workflows.audit.history_view import show_history

    view = show_history(str(folder), trend=str(out / "trend.html"))
    view.table()


def measure(step: str, folder: Path, nights: int, partitions: int, out: Path) -> dict:
    """Run `step` in a fresh process: its wall time and peak RSS."""
    code = (
        "import sys, time, resource, json; sys.path.insert(0, 'benchmarks'); import history_scale as h; "
        "from pathlib import Path; t = time.perf_counter(); "
        + (
            f"h.judge(Path({str(folder)!r}), {nights}, {partitions})"
            if step == "judge"
            else f"h.read(Path({str(folder)!r}), Path({str(out)!r}))"
        )
        + "; print(json.dumps({'seconds': round(time.perf_counter() - t, 3), "
        "'peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {
        "step": step,
        "nights": nights,
        "partitions": partitions,
        **json.loads(done.stdout.strip().splitlines()[-1]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nights", type=int, default=365)
    p.add_argument("--partitions", type=int, default=500)
    p.add_argument("--out", default="out/history-bench")
    args = p.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for nights in (args.nights // 4, args.nights):
        folder = out / f"hist-{nights}"
        started = time.perf_counter()
        build(folder, nights, args.partitions)
        print(json.dumps({"step": "build", "nights": nights, "seconds": round(time.perf_counter() - started, 1)}))
        for step in ("judge", "read"):
            print(json.dumps(measure(step, folder, nights, args.partitions, out)), flush=True)
    print(
        json.dumps(
            {"baseline_process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        )
    )


if __name__ == "__main__":
    main()
