"""What a comparison with the baseline audit concludes, as audit.json records it: the thresholds it judges
by (`Thresholds`), each scope's verdict (`Check`: the corpus `OVERALL` and each partition) and the run's
(`Comparison`, with its exit code). `baseline.py` makes the comparison. Exit codes 1 (data loss) and 2 (user
errors) are taken by the CLI.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ...options import check, option

__all__ = [
    "Check",
    "Comparison",
    "Thresholds",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "EXIT_INCOMPARABLE",
    "EXIT_INSUFFICIENT",
    "OVERALL",
    "METRICS",
    "REGRESSION",
    "IMPROVEMENT",
    "NO_CHANGE",
    "INSUFFICIENT",
    "NEW",
    "VANISHED",
]

EXIT_OK = 0  # no baseline, or every scope shows no change or an improvement
EXIT_REGRESSION = 3  # some partition or the whole corpus regressed against the baseline
EXIT_INCOMPARABLE = 4  # nothing regressed, but the baseline was scored by another model/variant
EXIT_INSUFFICIENT = 5  # nothing regressed, but some scope's data could not tell (see accept_insufficient)

OVERALL = "(overall)"  # the name of the whole-corpus scope: its check in a comparison, its outlier cutoff
METRICS = ("pppl_token", "pppl_word")

# Verdicts of one scope, worst first.
REGRESSION, INSUFFICIENT, IMPROVEMENT, NO_CHANGE = "regression", "insufficient data", "improvement", "no change"
NEW, VANISHED = "new", "vanished"  # reported, not judged


@dataclass(frozen=True)
class Thresholds:
    """When a scope regresses against the baseline, and how sure the judgement must be.

    `max_pppl_increase` is relative (0.05 = +5 %) and sets the band [1 / (1 + t), 1 + t] of the PPPL ratio
    inside which a change counts as none; `max_error_rate_increase` is absolute (0.01 = one point) and
    sets the band +-t of the error-rate difference. `max_pppl_decrease`, when set, also makes a PPPL fall
    beyond it a regression (a corpus that got suspiciously easy). Intervals are at `confidence`, seeded by
    `seed`. Scopes with fewer than `min_rows` rows on either side are `insufficient data`. Each field
    declares its flag (`dscore audit`'s), whose help, choices and bounds check it.
    """

    metric: str = option("pppl_token", "PPPL compared with the baseline (default {default})", choices=METRICS)
    max_pppl_increase: float = option(0.05, "relative PPPL rise that counts as a regression (default {default})", low=0)
    max_pppl_decrease: float | None = option(  # a relative fall: 0.2 = -20 %
        None,
        "relative PPPL fall that also counts as a regression, a corpus that got suspiciously easy "
        "(default: none; a fall is an improvement)",
        low=0,
        high=1,
        below=True,
        type=float,
    )
    max_error_rate_increase: float = option(  # a rate rises by 1 at most
        0.01, "absolute error-rate rise that counts as a regression (default {default})", low=0, high=1
    )
    min_rows: int = option(
        10, "a scope with fewer rows on either side is 'insufficient data' (default {default})", low=2
    )
    confidence: float = option(
        0.95,
        "confidence level of the intervals that verdicts are read from (default {default})",
        low=0.5,
        high=1,
        below=True,
    )
    seed: int = option(0, "seed of the bootstrap (recorded in audit.json)", low=0)  # numpy takes no negative seed
    accept_insufficient: bool = option(
        False, f"do not fail (exit {EXIT_INSUFFICIENT}) when some scope has too little data to judge"
    )

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class Check:
    """One scope (a partition, or the corpus `OVERALL`) against the baseline.

    `status` is the scope's verdict (REGRESSION, IMPROVEMENT, NO_CHANGE, INSUFFICIENT) or NEW / VANISHED;
    `pppl_ratio` is current / baseline with its interval, `error_rate_change` the absolute difference
    with its interval; `reasons` say why, one line each.
    """

    name: str
    status: str
    rows: int | None
    baseline_rows: int | None
    pppl: float | None
    baseline_pppl: float | None
    pppl_ratio: float | None = None
    pppl_ratio_low: float | None = None
    pppl_ratio_high: float | None = None
    pppl_verdict: str | None = None
    error_rate: float | None = None
    baseline_error_rate: float | None = None
    error_rate_change: float | None = None
    error_rate_change_low: float | None = None
    error_rate_change_high: float | None = None
    error_rate_verdict: str | None = None
    paired: bool = False
    reasons: tuple[str, ...] = ()

    @property
    def pppl_change(self) -> float | None:
        return None if self.pppl_ratio is None else self.pppl_ratio - 1

    def to_json(self) -> dict:
        return {**asdict(self), "pppl_change": self.pppl_change, "reasons": list(self.reasons)}

    @classmethod
    def from_json(cls, data: dict) -> "Check":
        """`pppl_change` is derived, so it is not read back."""
        known = {f.name for f in fields(cls)} - {"reasons"}
        return cls(**{k: v for k, v in data.items() if k in known}, reasons=tuple(data["reasons"]))


@dataclass(frozen=True)
class Comparison:
    """The audit against a baseline audit: each scope's verdict and why, and the run's exit code.

    `methods` says how the intervals were computed: one line per figure and method, with how many scopes
    it served, paired and unpaired (`_methods`).
    """

    source: str
    thresholds: Thresholds
    overall: Check
    partitions: tuple[Check, ...]
    signature_mismatch: str | None = None
    methods: tuple[str, ...] = ()

    def _with(self, status: str) -> tuple[Check, ...]:
        return tuple(c for c in (self.overall, *self.partitions) if c.status == status)

    @property
    def regressions(self) -> tuple[Check, ...]:
        return self._with(REGRESSION)

    @property
    def insufficient(self) -> tuple[Check, ...]:
        return self._with(INSUFFICIENT)

    @property
    def new_partitions(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._with(NEW))

    @property
    def vanished_partitions(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._with(VANISHED))

    @property
    def exit_code(self) -> int:
        if self.regressions:
            return EXIT_REGRESSION
        if self.insufficient and not self.thresholds.accept_insufficient:
            return EXIT_INSUFFICIENT
        return EXIT_INCOMPARABLE if self.signature_mismatch else EXIT_OK

    @property
    def verdict(self) -> str:
        return {
            EXIT_OK: "pass",
            EXIT_REGRESSION: "regression",
            EXIT_INCOMPARABLE: "incomparable",
            EXIT_INSUFFICIENT: INSUFFICIENT,
        }[self.exit_code]

    def to_json(self) -> dict:
        """The `baseline` object of audit.json: the checks, and the verdicts derived from them."""
        return {
            "source": self.source,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "metric": self.thresholds.metric,
            "thresholds": asdict(self.thresholds),
            "methods": list(self.methods),
            "signature_mismatch": self.signature_mismatch,
            "regressed": [c.name for c in self.regressions],
            "insufficient": [c.name for c in self.insufficient],
            "new_partitions": list(self.new_partitions),
            "vanished_partitions": list(self.vanished_partitions),
            "overall": self.overall.to_json(),
            "partitions": {c.name: c.to_json() for c in self.partitions},
        }

    @classmethod
    def from_json(cls, data: dict) -> "Comparison":
        """The comparison an audit.json recorded; its verdict and lists are derived again from the checks."""
        partitions = tuple(Check.from_json(c) for _, c in sorted(data["partitions"].items()))
        return cls(
            data["source"],
            Thresholds(**data["thresholds"]),
            Check.from_json(data["overall"]),
            partitions,
            data["signature_mismatch"],
            tuple(data["methods"]),
        )
