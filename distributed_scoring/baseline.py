"""Comparison of an audit with a previous one (the baseline `audit.json`), and the audit's exit codes.

Each partition and the whole corpus regress when PPPL rose (or fell) by more than a relative threshold,
or the error rate rose by more than an absolute one. PPPLs are judged only when both audits were scored
by the same model and variant; otherwise only error rates are, and the verdict is "incomparable". The
exit codes below are what `dscore audit` returns; 1 (data loss) and 2 (user errors) are taken by the CLI.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from . import schema as S
from .errors import UserError
from .storage import filesystem, join, open_binary

__all__ = [
    "Check", "Comparison", "Thresholds", "compare", "load_baseline",
    "EXIT_OK", "EXIT_REGRESSION", "EXIT_INCOMPARABLE", "OVERALL", "METRICS", "AUDIT_FILE", "SCHEMA_VERSION",
]

EXIT_OK = 0  # no baseline, or every partition and the corpus hold
EXIT_REGRESSION = 3  # some partition or the whole corpus regressed against the baseline
EXIT_INCOMPARABLE = 4  # nothing regressed, but the baseline was scored by another model/variant

SCHEMA_VERSION = 1  # of audit.json: a baseline of another version is refused
AUDIT_FILE = "audit.json"
OVERALL = "(overall)"  # the name of the whole-corpus check in a comparison (and of the corpus-wide cutoff)
METRICS = ("pppl_token", "pppl_word")


@dataclass(frozen=True)
class Thresholds:
    """When a partition (or the corpus) regresses against the baseline.

    PPPL changes are relative (0.05 = +5 %), error-rate changes absolute (0.01 = one percentage point);
    a change regresses when it is strictly beyond its threshold. `max_pppl_decrease=None` leaves drops
    unchecked. Partitions with fewer than `min_rows` rows on either side are reported but not judged.
    """

    metric: str = "pppl_token"
    max_pppl_increase: float = 0.05
    max_pppl_decrease: float | None = None
    max_error_rate_increase: float = 0.01
    min_rows: int = 100

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise UserError(f"regression metric {self.metric!r} is not one of {METRICS}")
        limits = [self.max_pppl_increase, self.max_error_rate_increase, self.max_pppl_decrease or 0.0]
        if min(limits) < 0 or self.min_rows < 0:
            raise UserError(f"regression thresholds must not be negative: {self}")


@dataclass(frozen=True)
class Check:
    """One partition (or the corpus, `OVERALL`) against the baseline.

    status: "ok", "regressed", "skipped" (too few rows), "new" (no baseline figures) or "vanished"
    (no rows this time). PPPL change is relative, error-rate change absolute.
    """

    name: str
    status: str
    rows: int | None
    baseline_rows: int | None
    pppl: float | None
    baseline_pppl: float | None
    pppl_change: float | None
    error_rate: float | None
    baseline_error_rate: float | None
    error_rate_change: float | None
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Comparison:
    """The audit against a baseline audit: which partitions regress and why, and the exit code."""

    source: str
    thresholds: Thresholds
    overall: Check
    partitions: tuple[Check, ...]
    signature_mismatch: str | None = None

    @property
    def regressions(self) -> tuple[Check, ...]:
        return tuple(c for c in (self.overall, *self.partitions) if c.status == "regressed")

    @property
    def new_partitions(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.partitions if c.status == "new")

    @property
    def vanished_partitions(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.partitions if c.status == "vanished")

    @property
    def exit_code(self) -> int:
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_INCOMPARABLE if self.signature_mismatch else EXIT_OK

    @property
    def verdict(self) -> str:
        return {EXIT_OK: "pass", EXIT_REGRESSION: "regression", EXIT_INCOMPARABLE: "incomparable"}[self.exit_code]

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "metric": self.thresholds.metric,
            "thresholds": asdict(self.thresholds),
            "signature_mismatch": self.signature_mismatch,
            "regressed": [c.name for c in self.regressions],
            "new_partitions": list(self.new_partitions),
            "vanished_partitions": list(self.vanished_partitions),
            "overall": self.overall.to_dict(),
            "partitions": {c.name: c.to_dict() for c in self.partitions},
        }


def load_baseline(uri: str) -> dict:
    """A previous audit.json (path or URI, or the folder holding it), checked for its schema version."""
    fs, path = filesystem(uri)
    if fs is not None:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.NotFound:
            raise UserError(f"baseline {uri!r} does not exist: pass a previous run's {AUDIT_FILE} or its folder")
        if kind == pafs.FileType.Directory:
            uri = join(uri, AUDIT_FILE)
    try:
        with open_binary(uri, seekable=False) as stream:
            data = json.loads(stream.read())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read baseline {uri!r}: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise UserError(f"baseline {uri!r} has audit schema version {found!r}, expected {SCHEMA_VERSION}")
    return data


def compare(current: dict, baseline: dict, source: str, thresholds: Thresholds = Thresholds()) -> Comparison:
    """Judge every partition and the corpus of `current` against `baseline` (both audit.json dicts)."""
    mismatch = _signature_mismatch(current["signature"], baseline["signature"])
    now, before = current["partitions"], baseline["partitions"]
    checks = tuple(
        _check(name, now.get(name), before.get(name), thresholds, mismatch is None)
        for name in sorted(set(now) | set(before))
    )
    overall = _check(OVERALL, current["overall"], baseline["overall"], thresholds, mismatch is None)
    return Comparison(source, thresholds, overall, checks, mismatch)


def _check(name: str, now: dict | None, before: dict | None, t: Thresholds, same_scorer: bool) -> Check:
    """Judge one partition; PPPL is judged only when both sides were scored by the same scorer."""
    if before is None:
        return Check(name, "new", now["rows"], None, now[t.metric], None, None, now["error_rate"], None, None)
    if now is None:
        return Check(
            name, "vanished", None, before["rows"], None, before[t.metric], None, None, before["error_rate"], None
        )
    pppl, base_pppl = now[t.metric], before[t.metric]
    change = pppl / base_pppl - 1 if pppl is not None and base_pppl else None
    rate_change = now["error_rate"] - before["error_rate"]
    if min(now["rows"], before["rows"]) < t.min_rows:
        status, reasons = "skipped", [f"fewer than {t.min_rows} rows ({before['rows']} -> {now['rows']}): not judged"]
    else:
        reasons = _pppl_reasons(t, base_pppl, pppl, change) if same_scorer else []
        if rate_change > t.max_error_rate_increase:
            reasons.append(
                f"error rate rose {rate_change * 100:+.2f} points ({before['error_rate']:.2%} -> "
                f"{now['error_rate']:.2%}), more than the allowed {t.max_error_rate_increase * 100:.2f} points"
            )
        status = "regressed" if reasons else "ok"
    return Check(
        name, status, now["rows"], before["rows"], pppl, base_pppl, change,
        now["error_rate"], before["error_rate"], rate_change, tuple(reasons),
    )


def _pppl_reasons(t: Thresholds, before: float | None, now: float | None, change: float | None) -> list[str]:
    if change is None:
        return []
    moved = f"{t.metric} {'rose' if change > 0 else 'fell'} {change:+.1%} ({before:.4g} -> {now:.4g})"
    if change > t.max_pppl_increase:
        return [f"{moved}, more than the allowed +{t.max_pppl_increase:.1%}"]
    if t.max_pppl_decrease is not None and -change > t.max_pppl_decrease:
        return [f"{moved}, more than the allowed -{t.max_pppl_decrease:.1%}"]
    return []


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
