"""Comparison of an audit with a previous one (the baseline `audit.json`): each scope's verdict and the run's.

Every scope (the whole corpus and each partition present in both audits) is judged by the uncertainty
of its change, not by a row count (`intervals.py` computes the intervals):

- PPPL: a confidence interval of the ratio current / baseline. `regression` when the interval lies
  entirely above 1 + tolerance (`max_pppl_increase`), `improvement` when entirely below 1 / (1 +
  tolerance) (the same band in log space), `no change` when it lies inside the band, and `insufficient
  data` when it crosses a band edge: the rows cannot tell whether PPPL moved by more than the tolerance.
- Error rate: an interval of the difference current - baseline, judged against +-`max_error_rate_increase`
  in the same way.

The intervals are paired when both audits hold exactly the same row ids in a scope (the same corpus
scored again: per-row differences, much tighter), unpaired otherwise. A scope with fewer than
`min_rows` rows on either side is `insufficient data`. `insufficient data` is never a pass: it has its
own exit code unless `accept_insufficient` is set. PPPLs are judged only when both audits were scored by
the same model and variant; otherwise only error rates are, and the run is "incomparable". The run's
verdict is its worst scope's, and gives the audit's exit code. The verdicts, the thresholds and the exit codes,
as audit.json records them, are `verdicts.py`'s; `baseline_io.py` reads the baseline's files and makes the
per-row figures.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...io import schema as S
from .intervals import Interval, Sums, proportion_difference, ratio_difference, scope_rng
from .row_stats import OK_COLUMN, ROW_STATS_FILE
from .verdicts import (
    IMPROVEMENT,
    INSUFFICIENT,
    NEW,
    NO_CHANGE,
    OVERALL,
    REGRESSION,
    VANISHED,
    Check,
    Comparison,
    Thresholds,
)

if TYPE_CHECKING:
    from .records import AuditRecord, ScopeFigures

__all__ = [
    "compare",
    "AUDIT_FILE",
    "SCHEMA_VERSION",
]

SCHEMA_VERSION = 2  # of audit.json; version 1 files are still read as baselines
READABLE_VERSIONS = (1, 2)
AUDIT_FILE = "audit.json"

# Verdicts of one scope by severity: a scope's is the worst of its figures'.
_SEVERITY = {REGRESSION: 3, INSUFFICIENT: 2, IMPROVEMENT: 1, NO_CHANGE: 0}

_DENOMINATOR = {"pppl_token": S.N_TOKENS, "pppl_word": S.N_WORDS}
_ERROR_RATE_FIGURE = "error rate change"  # the PPPL's figure is "<metric> ratio"


def compare(
    current: AuditRecord,
    baseline: AuditRecord,
    source: str,
    thresholds: Thresholds = Thresholds(),
    current_rows: pa.Table | None = None,
    baseline_rows: pa.Table | None = None,
) -> Comparison:
    """Judge the corpus and every partition of `current` against `baseline` (both audits, with their
    per-row figures when available)."""
    mismatch = _signature_mismatch(current.signature, baseline.signature)
    now, before = current.partitions, baseline.partitions
    judge = _Judge(thresholds, mismatch is None, current_rows, baseline_rows)
    checks = tuple(judge.check(name, now.get(name), before.get(name)) for name in sorted(set(now) | set(before)))
    overall = judge.check(OVERALL, current.overall, baseline.overall)
    return Comparison(source, thresholds, overall, checks, mismatch, _methods(judge.uses))


def _methods(uses: Counter) -> tuple[str, ...]:
    """One line per figure and method, the PPPL's first: "pppl_token ratio: percentile bootstrap over rows,
    2000 resamples (paired in 1 scope, unpaired in 2)"; `uses` counts the scopes per (figure, method, paired)."""
    scopes: dict[tuple[str, str], dict[bool, int]] = {}
    for (figure, method, paired), n in uses.items():
        scopes.setdefault((figure, method), {})[paired] = n
    lines = []
    for (figure, method), counts in sorted(
        scopes.items(), key=lambda item: (item[0][0] == _ERROR_RATE_FIGURE, item[0])
    ):
        present = [paired for paired in (True, False) if paired in counts]
        parts = [f"{'paired' if paired else 'unpaired'} in {counts[paired]}" for paired in present]
        parts[0] += " scope" if counts[present[0]] == 1 else " scopes"
        lines.append(f"{figure}: {method} ({', '.join(parts)})")
    return tuple(lines)


@dataclass
class _Judge:
    t: Thresholds
    same_scorer: bool
    current_rows: pa.Table | None
    baseline_rows: pa.Table | None
    uses: Counter = field(default_factory=Counter)  # (figure, method, paired) -> the scopes judged with it
    current_parts: dict[str, pa.Table] = field(init=False)  # `_by_partition` of each side's rows, made once
    baseline_parts: dict[str, pa.Table] = field(init=False)

    def __post_init__(self) -> None:
        self.current_parts = {} if self.current_rows is None else _by_partition(self.current_rows)
        self.baseline_parts = {} if self.baseline_rows is None else _by_partition(self.baseline_rows)

    def check(self, name: str, now: ScopeFigures | None, before: ScopeFigures | None) -> Check:
        metric = self.t.metric
        if before is None:
            return Check(name, NEW, now.rows, None, now.figure(metric), None, error_rate=now.error_rate)
        if now is None:
            return Check(
                name, VANISHED, None, before.rows, None, before.figure(metric), baseline_error_rate=before.error_rate
            )
        figures = dict(
            rows=now.rows,
            baseline_rows=before.rows,
            pppl=now.figure(metric),
            baseline_pppl=before.figure(metric),
            error_rate=now.error_rate,
            baseline_error_rate=before.error_rate,
        )
        if min(now.rows, before.rows) < self.t.min_rows:
            reason = (
                f"fewer than {self.t.min_rows} rows ({before.rows} -> {now.rows}): too few to judge; "
                "lower --min-rows only if such a scope is meaningful"
            )
            return Check(name, INSUFFICIENT, **figures, reasons=(reason,))
        cur, base, paired = self._scope_tables(name)
        rng = scope_rng(self.t.seed, name)
        pppl = self._pppl(cur, base, paired, rng) if self.same_scorer else None
        errors = self._error_rate(now, before, cur, base, paired, rng)
        parts = [part for part in (pppl, errors) if part is not None]
        status = max([part[0] for part in parts], key=_SEVERITY.__getitem__)
        # Only what made the verdict: a PPPL regression is not explained by an error rate that could not tell.
        reasons = tuple(part[2] for part in parts if part[0] == status and part[2])
        p_int = pppl[1] if pppl else None
        e_int = errors[1]
        return Check(
            name,
            status,
            **figures,
            pppl_ratio=None if p_int is None else math.exp(-p_int.estimate),
            pppl_ratio_low=None if p_int is None else math.exp(-p_int.high),
            pppl_ratio_high=None if p_int is None else math.exp(-p_int.low),
            pppl_verdict=pppl[0] if pppl else None,
            error_rate_change=e_int.estimate if e_int else None,
            error_rate_change_low=e_int.low if e_int else None,
            error_rate_change_high=e_int.high if e_int else None,
            error_rate_verdict=errors[0],
            paired=paired,
            reasons=reasons,
        )

    def _scope_tables(self, name: str) -> tuple[pa.Table | None, pa.Table | None, bool]:
        """The scope's per-row figures now and in the baseline (all of them for the corpus, a partition's own:
        none, an empty table), and whether they pair up (the same ids; then both are sorted by id)."""
        cur, base = self.current_rows, self.baseline_rows
        if name != OVERALL:
            cur = None if cur is None else self.current_parts.get(name, cur.slice(0, 0))
            base = None if base is None else self.baseline_parts.get(name, base.slice(0, 0))
        paired = cur is not None and base is not None and _same_ids(cur, base)
        if paired:
            cur, base = cur.sort_by(S.ID), base.sort_by(S.ID)
        return cur, base, paired

    def _pppl(
        self, cur: pa.Table | None, base: pa.Table | None, paired: bool, rng: np.random.Generator
    ) -> tuple[str, Interval | None, str]:
        metric, t = self.t.metric, self.t
        if cur is None or base is None:
            return (
                INSUFFICIENT,
                None,
                (
                    f"{metric}: the baseline has no per-row figures (an audit.json written before "
                    f"{ROW_STATS_FILE} existed, or the file is gone): its change has no interval"
                ),
            )
        column = _DENOMINATOR[metric]
        interval = ratio_difference(_sums(cur, column), _sums(base, column), paired, t.confidence, rng)
        if interval is None:
            return INSUFFICIENT, None, f"{metric}: a side has no scored tokens"
        self.uses[(f"{metric} ratio", interval.method, interval.paired)] += 1
        ratio, low, high = math.exp(-interval.estimate), math.exp(-interval.high), math.exp(-interval.low)
        band = (1 / (1 + t.max_pppl_increase), 1 + t.max_pppl_increase)
        said = f"{metric} ratio {ratio:.4f} ({t.confidence:.0%} interval {low:.4f}-{high:.4f})"
        if low > band[1]:
            return REGRESSION, interval, f"{said} lies above the allowed +{t.max_pppl_increase:.1%}"
        if t.max_pppl_decrease is not None and high < 1 - t.max_pppl_decrease:
            return REGRESSION, interval, f"{said} lies below the allowed -{t.max_pppl_decrease:.1%}"
        if high < band[0]:
            return IMPROVEMENT, interval, f"{said} lies below the band {band[0]:.4f}-{band[1]:.4f}"
        if band[0] <= low and high <= band[1]:
            return NO_CHANGE, interval, ""
        return (
            INSUFFICIENT,
            interval,
            (
                f"{said} crosses the edge of the no-change band {band[0]:.4f}-{band[1]:.4f}: "
                "too few rows or too much spread to tell"
            ),
        )

    def _error_rate(
        self,
        now: ScopeFigures,
        before: ScopeFigures,
        cur: pa.Table | None,
        base: pa.Table | None,
        paired: bool,
        rng: np.random.Generator,
    ) -> tuple[str, Interval, str]:
        t = self.t
        if paired:
            interval = ratio_difference(_error_sums(cur), _error_sums(base), True, t.confidence, rng)
        else:
            interval = proportion_difference(now.errors, now.rows, before.errors, before.rows, t.confidence)
        self.uses[(_ERROR_RATE_FIGURE, interval.method, interval.paired)] += 1
        said = (
            f"error rate {before.error_rate:.2%} -> {now.error_rate:.2%} (change {interval.estimate * 100:+.2f} "
            f"points, {t.confidence:.0%} interval {interval.low * 100:+.2f} to {interval.high * 100:+.2f})"
        )
        tol = t.max_error_rate_increase
        if interval.low > tol:
            return REGRESSION, interval, f"{said} lies above the allowed +{tol * 100:.2f} points"
        if interval.high < -tol:
            return IMPROVEMENT, interval, ""
        if -tol <= interval.low and interval.high <= tol:
            return NO_CHANGE, interval, ""
        return INSUFFICIENT, interval, f"{said} crosses the edge of the no-change band +-{tol * 100:.2f} points"


def _by_partition(rows: pa.Table) -> dict[str, pa.Table]:
    """The rows of each partition, in their order (a stable sort, then zero-copy slices): one pass over
    the table, where a filter per partition made N x partitions comparisons (hours at 10^6 rows in 10^4
    files, partitioned by file)."""
    ordered = rows.take(pc.sort_indices(rows[S.PARTITION]))  # stable: each partition keeps its row order
    counts = pc.value_counts(ordered[S.PARTITION])  # in order of appearance, which is sorted order
    names, sizes = counts.field("values").to_pylist(), counts.field("counts").to_numpy()
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return {name: ordered.slice(int(start), int(size)) for name, start, size in zip(names, starts, sizes)}


def _sums(rows: pa.Table, denominator: str) -> Sums:
    x = pc.fill_null(rows[S.PLL], 0.0).to_numpy().astype(np.float64)
    return Sums(x, rows[denominator].to_numpy().astype(np.float64))


def _error_sums(rows: pa.Table) -> Sums:
    errors = (~rows[OK_COLUMN].to_numpy(zero_copy_only=False)).astype(np.float64)
    return Sums(errors, np.ones_like(errors))


def _same_ids(a: pa.Table, b: pa.Table) -> bool:
    """Both tables hold exactly the same row ids, each once: the same corpus scored twice."""
    if a.num_rows != b.num_rows or a.num_rows == 0:
        return False
    ids_a, ids_b = pc.sort_indices(a[S.ID]), pc.sort_indices(b[S.ID])
    sorted_a, sorted_b = a[S.ID].take(ids_a), b[S.ID].take(ids_b)
    return sorted_a.equals(sorted_b) and pc.count_distinct(sorted_a).as_py() == a.num_rows


def _signature_mismatch(current: dict | list, baseline: dict | list) -> str | None:
    """Why PPPLs of the two audits cannot be compared (other model or variant), or None."""

    def pairs(signature: dict | list) -> list[tuple[str, str]]:
        return sorted((s[S.MODEL], s[S.VARIANT]) for s in (signature if isinstance(signature, list) else [signature]))

    now, before = pairs(current), pairs(baseline)
    if now == before or not now or not before:
        return None  # the same scorer, or one side has no rows to compare
    return (
        f"the baseline was scored by {before}, this run by {now} (model, variant): "
        "PPPLs are only comparable under the same model and variant, so only error rates were judged"
    )
