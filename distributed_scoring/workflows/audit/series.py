"""Verdicts on the series of nights (`dscore audit --history`): tonight against the nights before it.

A single baseline misses a slow creep, moves with one bad night and compares no shapes. Here each scope (the
corpus `OVERALL` and each partition) is judged against the last `window` comparable nights (the same
scorer: one segment of the history) by three rules, each giving regression / improvement / no change /
insufficient data with its reason (`Rule`):

- **rolling**: x = log PPPL tonight against the *median* of the reference nights' x, so one bad night in the
  window moves nothing. Its interval: tonight's deviation has the larger of its own standard error (rows,
  delta method) and the nights' robust spread (1.4826 MAD) as its sd, and the median of n nights adds
  (pi/2) sigma^2 / n. Judged on the band [-log(1 + t), log(1 + t)] as the baseline comparison is
  (`Thresholds.max_pppl_increase`), the error rate likewise on Newcombe's interval against the median
  night's rate (over 2/pi of the window's rows, the median's efficiency).
- **drift**: the Theil-Sen slope of x over the window and tonight (the median of pairwise slopes: one bad
  night moves it little), with Sen's rank interval; the change it implies across the window is judged on the
  same band. A creep of 1.5 % a night, each step inside a 5 % threshold, adds up past it within a week.
- **shape**: the share of tonight's rows above the reference's 90th percentile of per-row NLL per token (the
  median of the nights' own), with its Wilson interval, judged on 10 % +- `max_tail_increase`: a tail of
  junk that grows while typical rows get easier leaves the PPPL flat and moves this share. The share below
  the 10th percentile and the population stability index of the histogram against the pooled reference's
  are reported beside it.

Too few comparable nights (`min_nights`; drift needs 5 points) is `insufficient history`. Partitions that
appear, vanish or return are events of the night, reported and not judged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

from ...options import check, option
from .intervals import proportion_difference, wilson
from .verdicts import IMPROVEMENT, INSUFFICIENT, NO_CHANGE, REGRESSION, Thresholds

__all__ = [
    "INSUFFICIENT_HISTORY",
    "Night",
    "Rule",
    "ScopeSeries",
    "SeriesRules",
    "judge_scope",
    "theil_sen",
    "TAIL",
]

INSUFFICIENT_HISTORY = "insufficient history"
TAIL = 0.10  # the reference's head and tail: below its 10th and above its 90th percentile
_MAD_SIGMA = 1.4826  # MAD -> sd of a normal
_DRIFT_MIN_POINTS = 5  # Sen's interval has a finite lower end from 5 points on
_SEVERITY = {REGRESSION: 4, INSUFFICIENT: 3, INSUFFICIENT_HISTORY: 2, IMPROVEMENT: 1, NO_CHANGE: 0}


@dataclass(frozen=True)
class SeriesRules:
    """How the series judges tonight (`dscore audit --history`'s flags); the PPPL and error-rate bands and the
    confidence are the baseline's (`Thresholds`)."""

    window: int = option(7, "comparable nights in the rolling reference and the drift test (default {default})", low=3)
    min_nights: int = option(
        3, "comparable nights a scope needs before the series judges it (default {default})", low=2
    )
    max_tail_increase: float = option(
        0.05,
        "absolute rise of the share of rows above the reference's 90th percentile of NLL that counts as a shape "
        "regression (default {default})",
        low=0,
        high=0.89,
    )
    canary_tolerance: float = option(
        1e-3,
        "largest move of a canary text's PLL, in nats per token, taken as float noise (default {default})",
        low=0,
    )
    require_history: bool = option(
        False, "exit 5 when the series cannot judge tonight (too few comparable nights, or data that cannot tell)"
    )

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class Night:
    """One scope's figures on one night, as the history keeps them (`history.py`): x = log PPPL of the metric
    and its standard error, the 10th and 90th percentiles of per-row NLL per token, the histogram counts."""

    night: str
    rows: int
    errors: int
    log_pppl: float | None
    log_pppl_se: float | None
    q10: float | None
    q90: float | None
    histogram: tuple[int, ...] = ()


@dataclass(frozen=True)
class Rule:
    """One rule's verdict on one scope: `estimate` with its interval (rolling: PPPL ratio to the reference;
    drift: the PPPL ratio the slope implies across the window; shape: the tail share) and `reference` (the
    reference PPPL; the tail's cut in NLL per token)."""

    status: str
    reason: str
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    reference: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ScopeSeries:
    """A scope tonight against its reference nights."""

    name: str
    nights: int  # comparable reference nights the scope has
    rolling: Rule
    drift: Rule
    shape: Rule
    head_share: float | None = None
    psi: float | None = None
    reference_nights: tuple[str, ...] = field(default=())
    recent: tuple[tuple[str, float | None, str | None], ...] = ()  # (night, PPPL, status), the window and tonight

    @property
    def status(self) -> str:
        return max((self.rolling.status, self.drift.status, self.shape.status), key=_SEVERITY.__getitem__)

    @property
    def flagged(self) -> tuple[str, ...]:
        """The rules that call tonight a regression."""
        return tuple(name for name, rule in self.rules() if rule.status == REGRESSION)

    def rules(self) -> tuple[tuple[str, Rule], ...]:
        return (("rolling", self.rolling), ("drift", self.drift), ("shape", self.shape))

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "nights": self.nights,
            "reference_nights": list(self.reference_nights),
            **{name: rule.to_json() for name, rule in self.rules()},
            "head_share": self.head_share,
            "psi": self.psi,
            "recent": [list(point) for point in self.recent],
        }


def judge_scope(
    name: str, tonight: Night, nll: np.ndarray | None, reference: list[Night], t: Thresholds, rules: SeriesRules
) -> ScopeSeries:
    """The scope `name` tonight (its figures, and its rows' NLL per token when known) against its comparable
    nights before it, oldest first (`reference`: at most `rules.window`)."""
    nights = tuple(n.night for n in reference)
    usable = [n for n in reference if n.log_pppl is not None]
    if len(usable) < rules.min_nights or tonight.log_pppl is None:
        why = (
            f"{len(usable)} comparable night(s) with a PPPL before tonight, {rules.min_nights} needed"
            if tonight.log_pppl is not None
            else "no scored rows tonight"
        )
        short = Rule(INSUFFICIENT_HISTORY, why)
        return ScopeSeries(name, len(usable), short, short, short, reference_nights=nights)
    shape, head, psi = _shape(tonight, nll, usable, t, rules)
    return ScopeSeries(
        name, len(usable), _rolling(tonight, usable, t), _drift(tonight, usable, t), shape, head, psi, nights
    )


def _band_status(low: float, high: float, up: float, down: float) -> str:
    """An interval against a band [down, up] (down < 0 < up): beyond it, inside it, or across an edge."""
    if low > up:
        return REGRESSION
    if high < down:
        return IMPROVEMENT
    return NO_CHANGE if down <= low and high <= up else INSUFFICIENT


def _pppl_band(t: Thresholds) -> tuple[float, float, bool]:
    """The band of log PPPL changes that count as none, and whether a fall beyond it is a regression."""
    up = math.log1p(t.max_pppl_increase)
    if t.max_pppl_decrease is not None:
        return up, math.log1p(-t.max_pppl_decrease), True
    return up, -up, False


def _judged(low: float, high: float, t: Thresholds) -> str:
    up, down, fall_regresses = _pppl_band(t)
    status = _band_status(low, high, up, down)
    return REGRESSION if status == IMPROVEMENT and fall_regresses else status


def _rolling(tonight: Night, reference: list[Night], t: Thresholds) -> Rule:
    x = np.array([n.log_pppl for n in reference])  # (n,)
    centre = float(np.median(x))
    spread = _MAD_SIGMA * float(np.median(np.abs(x - centre)))
    floor = float(np.median([n.log_pppl_se or 0.0 for n in reference]))
    sigma = max(spread, floor)  # the nights' sd, never under what their rows' sampling alone gives
    sd = math.sqrt(max(tonight.log_pppl_se or 0.0, spread) ** 2 + math.pi / 2 * sigma**2 / len(x))
    z = NormalDist().inv_cdf(0.5 + t.confidence / 2)
    d = tonight.log_pppl - centre
    low, high = d - z * sd, d + z * sd
    pppl = _judged(low, high, t)
    errors = _error_rate(tonight, reference, t)
    status = max(pppl, errors[0], key=_SEVERITY.__getitem__)
    reason = (
        f"PPPL {math.exp(tonight.log_pppl):.4g} against the median {math.exp(centre):.4g} of {len(x)} nights: "
        f"ratio {math.exp(d):.4f} [{math.exp(low):.4f}, {math.exp(high):.4f}] ({pppl})"
    )
    if errors[0] != NO_CHANGE:
        reason += f"; {errors[1]}"
    return Rule(status, reason, math.exp(d), math.exp(low), math.exp(high), math.exp(centre))


def _error_rate(tonight: Night, reference: list[Night], t: Thresholds) -> tuple[str, str]:
    """Tonight's error rate against the median night's (its median rows), Newcombe's interval on +-t."""
    if tonight.rows == 0:
        return NO_CHANGE, ""
    # The median night's rate, over the rows that pin it down: a median of rates is as precise as a mean over
    # 2/pi of the pooled rows (its asymptotic efficiency), and one bad night does not move it.
    rows = int(sum(n.rows for n in reference) * 2 / math.pi)
    rate = float(np.median([n.errors / n.rows if n.rows else 0.0 for n in reference]))
    if rows == 0:
        return NO_CHANGE, ""
    interval = proportion_difference(tonight.errors, tonight.rows, round(rate * rows), rows, t.confidence)
    band = t.max_error_rate_increase
    status = _band_status(interval.low, interval.high, band, -band)
    return status, (
        f"error rate {tonight.errors / tonight.rows:.4f} against the median {rate:.4f}: "
        f"change {interval.estimate:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}] ({status})"
    )


def theil_sen(y: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """The Theil-Sen slope of `y` over 0..n-1 and Sen's two-sided rank interval at `confidence` (-inf or inf
    where the points are too few to bound it): the median of the pairwise slopes, and the slopes of ranks
    (N - C) / 2 and (N + C) / 2 + 1 among the N sorted, C = z sqrt(n (n - 1) (2n + 5) / 18)."""
    n = len(y)
    i, j = np.triu_indices(n, k=1)
    slopes = np.sort((y[j] - y[i]) / (j - i))  # (N,)
    count = len(slopes)
    c = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    lower, upper = math.floor((count - c) / 2), math.ceil((count + c) / 2)  # 1-based ranks
    low = float(slopes[lower - 1]) if lower >= 1 else -math.inf
    high = float(slopes[upper]) if upper < count else math.inf
    return float(np.median(slopes)), low, high


def _drift(tonight: Night, reference: list[Night], t: Thresholds) -> Rule:
    y = np.array([*(n.log_pppl for n in reference), tonight.log_pppl])  # (n + 1,) oldest first
    if len(y) < _DRIFT_MIN_POINTS:
        return Rule(INSUFFICIENT_HISTORY, f"{len(y)} nights with tonight, {_DRIFT_MIN_POINTS} needed for a trend")
    slope, low, high = theil_sen(y, t.confidence)
    span = len(y) - 1
    status = _judged(low * span, high * span, t)
    reason = (
        f"Theil-Sen slope {slope * 100:+.2f} % a night over {len(y)} nights, so x{math.exp(slope * span):.4f} across "
        f"them [x{_exp(low * span):.4f}, x{_exp(high * span):.4f}] ({status})"
    )
    return Rule(status, reason, math.exp(slope * span), _exp(low * span), _exp(high * span))


def _exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) else (0.0 if x < 0 else math.inf)


def _shape(
    tonight: Night, nll: np.ndarray | None, reference: list[Night], t: Thresholds, rules: SeriesRules
) -> tuple[Rule, float | None, float | None]:
    """The tail share's rule, the head share and the PSI against the pooled reference histogram."""
    psi = _psi(tonight.histogram, [n.histogram for n in reference])
    cuts = [(n.q10, n.q90) for n in reference if n.q10 is not None and n.q90 is not None]
    if nll is None or not cuts or nll.size == 0:
        return Rule(INSUFFICIENT_HISTORY, "no per-row figures tonight or no percentiles in the reference"), None, psi
    head_cut, tail_cut = (float(np.median([c[k] for c in cuts])) for k in (0, 1))
    tail = int((nll > tail_cut).sum())
    head = float((nll < head_cut).mean())
    low, high = wilson(tail, nll.size, t.confidence)
    m = rules.max_tail_increase
    status = _band_status(low, high, TAIL + m, TAIL - m)
    reason = (
        f"{tail} of {nll.size} rows ({tail / nll.size:.1%}) above the reference's 90th percentile "
        f"({tail_cut:.4g} nats per token), [{low:.1%}, {high:.1%}] against {TAIL:.0%} +- {m:.0%} ({status}); "
        f"{head:.1%} below its 10th"
    )
    return Rule(status, reason, tail / nll.size, low, high, tail_cut), head, psi


def _psi(tonight: tuple[int, ...], reference: list[tuple[int, ...]]) -> float | None:
    """Population stability index of tonight's histogram against the reference nights' pooled one, each bin's
    count smoothed by half a row (empty bins would give infinities)."""
    pooled = [h for h in reference if len(h) == len(tonight) and h]
    if not tonight or not pooled or sum(tonight) == 0:
        return None
    p = np.asarray(tonight, np.float64) + 0.5
    q = np.sum(pooled, axis=0, dtype=np.float64) + 0.5
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum((p - q) * np.log(p / q)))
