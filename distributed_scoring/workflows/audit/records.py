"""audit.json as typed records: what the audit writes, the baseline is read as, and the report renders.

Each record has one `to_json` (the exact object on disk, keys and values) and one `from_json` (which
also reads the version 1 files older code wrote), so readers use attributes, never string subscripts.
Only `config` stays a plain object: it is `asdict(AuditConfig)` recorded for people, and no code reads
it back beyond the metric.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ...io.output import recorded_values
from ...options import ADDED_LATER
from .nightly import SeriesRecord
from .outliers import Cutoff as RobustCutoff
from .verdicts import Comparison

__all__ = [
    "AuditRecord",
    "Bins",
    "Cutoff",
    "Histogram",
    "LengthCurve",
    "Listed",
    "OutlierRuleRecord",
    "Outliers",
    "PositionMeans",
    "Positionwise",
    "ScopeFigures",
    "UnknownListed",
    "UnknownTokens",
    "WorstRows",
]


def _flat(cls, data: dict):
    """A record of plain fields from its JSON object; a field the object lacks takes its default (version 1)."""
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class ScopeFigures:
    """The corpus figures of one scope (the whole corpus or a partition). `outlier_median` and `outlier_sigma`
    are the outlier rule's median and measured sigma of NLL per token over the scope's own eligible rows,
    whatever cutoff judged them tonight: the history keeps them for later nights' cutoffs (None: no eligible
    row, or a file written before them)."""

    rows: int
    ok: int
    errors: int
    sum_pll: float
    n_tokens: int
    n_words: int
    pppl_token: float | None
    pppl_word: float | None
    error_rate: float
    outliers: int
    outlier_median: float | None = field(default=None, metadata=ADDED_LATER)
    outlier_sigma: float | None = field(default=None, metadata=ADDED_LATER)

    def figure(self, metric: str) -> float | None:
        """The PPPL named by a `Thresholds.metric` (pppl_token or pppl_word)."""
        return getattr(self, metric)

    def to_json(self) -> dict:
        return recorded_values(self)

    @classmethod
    def from_json(cls, data: dict) -> "ScopeFigures":
        return _flat(cls, data)


@dataclass(frozen=True)
class Bins:
    """One histogram of per-sentence PPPL: counts per bin, plus those below and above the edges."""

    underflow: int
    counts: list[int]
    overflow: int

    def all_counts(self) -> tuple[int, ...]:
        """Underflow, the bins, overflow: the history's `histogram` column."""
        return (self.underflow, *self.counts, self.overflow)


@dataclass(frozen=True)
class Histogram:
    quantity: str
    edges: list[float]
    overall: Bins
    partitions: dict[str, Bins]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Histogram":
        partitions = {name: _flat(Bins, bins) for name, bins in data["partitions"].items()}
        return cls(data["quantity"], data["edges"], _flat(Bins, data["overall"]), partitions)


@dataclass(frozen=True)
class PositionMeans:
    sum_nll: list[float]
    tokens: list[int]
    mean_nll: list[float]


@dataclass(frozen=True)
class LengthCurve:
    sentences: int
    sum_nll: list[float]


@dataclass(frozen=True)
class Positionwise:
    """Positionwise cross-entropy (`audit.PositionCurves`), by absolute position and by sentence length."""

    quantity: str
    by_position: PositionMeans
    by_length: dict[str, LengthCurve]
    max_position: int
    max_length: int

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Positionwise":
        by_length = {length: _flat(LengthCurve, curve) for length, curve in data["by_length"].items()}
        return cls(
            data["quantity"],
            _flat(PositionMeans, data["by_position"]),
            by_length,
            data["max_position"],
            data["max_length"],
        )


@dataclass(frozen=True)
class OutlierRuleRecord:
    """The outlier rule as recorded: `outliers.OutlierRule`'s fields plus the statistic and MAD factor
    (absent from version 1 files) and the floor of sigma (absent from files written before it)."""

    k: float
    low_tail: bool
    min_tokens: int
    scope: str
    statistic: str | None = None
    sigma: str | None = None
    min_sigma: float | None = field(default=None, metadata=ADDED_LATER)


@dataclass(frozen=True)
class Cutoff(RobustCutoff):
    """A scope's outlier cutoff as recorded: the robust cutoff in NLL per token, and its bounds as
    per-sentence PPPL (what the histogram shows)."""

    high_pppl: float | None = None
    low_pppl: float | None = None


@dataclass(frozen=True)
class Listed:
    """One listed sentence as audit.json lists it: `flagged` says whether its list's rule flags it (None in
    files written when only flagged rows were listed)."""

    id: str
    partition: str
    text: str
    text_truncated: bool
    n_tokens: int
    nll_per_token: float
    pppl_token: float | None
    robust_z: float
    tail: str
    worst_position: int | None
    worst_token: str | None
    worst_token_nll: float | None
    flagged: bool | None = None


@dataclass(frozen=True)
class WorstRows:
    """The rows one scope's rule flags (`count`) and its highest rows, flagged or not (`listed`, with their z
    under it)."""

    count: int
    listed: list[Listed]

    @classmethod
    def from_json(cls, data: dict) -> "WorstRows":
        return cls(data["count"], [_flat(Listed, row) for row in data["listed"]])


@dataclass(frozen=True)
class Outliers:
    """The outliers of the rule's scope (`count`, `by_partition`, `listed`, the rows in `file`), and `worst`:
    the worst rows by each scope's rule whatever the rule's scope, by scope (`overall`, `partition`; absent
    from files written before it)."""

    rule: OutlierRuleRecord
    cutoffs: dict[str, Cutoff]
    eligible: int
    count: int
    by_partition: dict[str, int]
    listed: list[Listed]
    file: str
    worst: dict[str, WorstRows] | None = field(default=None, metadata=ADDED_LATER)

    def to_json(self) -> dict:
        return {
            **recorded_values(self),
            "rule": recorded_values(self.rule),
            "cutoffs": {name: recorded_values(cutoff) for name, cutoff in self.cutoffs.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> "Outliers":
        worst = data.get("worst")
        return cls(
            _flat(OutlierRuleRecord, data["rule"]),
            {name: _flat(Cutoff, cutoff) for name, cutoff in data["cutoffs"].items()},
            data["eligible"],
            data["count"],
            data["by_partition"],
            [_flat(Listed, row) for row in data["listed"]],
            data["file"],
            None if worst is None else {scope: WorstRows.from_json(rows) for scope, rows in worst.items()},
        )


@dataclass(frozen=True)
class UnknownListed:
    """One row mostly of unknown tokens as audit.json lists it."""

    id: str
    partition: str
    text: str
    text_truncated: bool
    n_tokens: int
    unknown_share: float
    nll_per_token: float


@dataclass(frozen=True)
class UnknownTokens:
    """The rows made mostly of the tokenizer's unknown token (`rule`), kept out of the outlier rule: their
    number, per partition, and the first `listed` in row order."""

    rule: str
    count: int
    by_partition: dict[str, int]
    listed: list[UnknownListed]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "UnknownTokens":
        return cls(data["rule"], data["count"], data["by_partition"], [_flat(UnknownListed, r) for r in data["listed"]])


@dataclass(frozen=True)
class AuditRecord:
    """audit.json. `version` is its `schema_version` (1 files lack `row_stats`); `baseline` is the
    comparison against the previous audit, None without one."""

    version: int
    row_stats: str | None
    created: str
    package_version: str
    rows_dir: str
    signature: dict | list[dict]
    scorer_signature: dict | list | None
    config: dict
    overall: ScopeFigures
    partitions: dict[str, ScopeFigures]
    histogram: Histogram
    positionwise: Positionwise | None
    outliers: Outliers
    baseline: Comparison | None = None
    estimate: dict | None = None  # scored by a maskless student: what it is and its held-out error (absent else)
    windowed_rows: int | None = None  # ok rows scored in windows (`--long-texts window`); absent for rows without
    series: SeriesRecord | None = None  # tonight in its history (`--history`); absent without one
    unknown_tokens: UnknownTokens | None = None  # rows mostly of unknown tokens; absent from files written before

    @property
    def metric(self) -> str:
        """The PPPL the audit judges by (`Thresholds.metric`)."""
        return self.config["thresholds"]["metric"]

    def to_json(self) -> dict:
        data = {
            "schema_version": self.version,
            "row_stats": self.row_stats,
            "created": self.created,
            "package_version": self.package_version,
            "rows_dir": self.rows_dir,
            "signature": self.signature,
            "scorer_signature": self.scorer_signature,
            "config": self.config,
            "overall": self.overall.to_json(),
            "partitions": {name: p.to_json() for name, p in self.partitions.items()},
            "histogram": self.histogram.to_json(),
            "positionwise": self.positionwise.to_json() if self.positionwise else None,
            "outliers": self.outliers.to_json(),
            "baseline": self.baseline.to_json() if self.baseline else None,
        }
        if self.estimate is not None:
            data["estimate"] = self.estimate
        if self.windowed_rows is not None:
            data["windowed_rows"] = self.windowed_rows
        if self.series is not None:
            data["series"] = self.series.to_json()
        if self.unknown_tokens is not None:
            data["unknown_tokens"] = self.unknown_tokens.to_json()
        return data if self.row_stats is not None else {k: v for k, v in data.items() if k != "row_stats"}

    @classmethod
    def from_json(cls, data: dict) -> "AuditRecord":
        positionwise, baseline, unknown = data["positionwise"], data.get("baseline"), data.get("unknown_tokens")
        return cls(
            data["schema_version"],
            data.get("row_stats"),
            data["created"],
            data["package_version"],
            data["rows_dir"],
            data["signature"],
            data["scorer_signature"],
            data["config"],
            ScopeFigures.from_json(data["overall"]),
            {name: ScopeFigures.from_json(p) for name, p in data["partitions"].items()},
            Histogram.from_json(data["histogram"]),
            Positionwise.from_json(positionwise) if positionwise else None,
            Outliers.from_json(data["outliers"]),
            Comparison.from_json(baseline) if baseline else None,
            data.get("estimate"),
            data.get("windowed_rows"),
            unknown_tokens=None if unknown is None else UnknownTokens.from_json(unknown),
        )
