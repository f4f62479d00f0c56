"""Confidence intervals for the audit's comparisons: differences of ratios of sums, and of proportions.

Corpus PPPL is exp(-R) with R = sum PLL / sum N, a ratio of sums over rows, so the change between two
audits is judged on D = R_current - R_baseline (PPPL ratio current / baseline = exp(-D)). The error rate
is the same kind of estimator with PLL replaced by an error indicator and N by 1.

- Paired (both audits hold exactly the same row ids): rows are resampled together, so the row-to-row
  spread that both runs share cancels; identical data gives the interval [0, 0].
- Unpaired: each side is resampled on its own.

Up to `BOOTSTRAP_MAX_ROWS` rows a side, a percentile bootstrap over rows (`replicates` resamples, seeded
per scope, so the same inputs always give the same interval); above it, where the central limit theorem
holds comfortably and a bootstrap would cost minutes, the delta method (linearised ratio estimator).
Unpaired error rates use Newcombe's hybrid score interval, which stays honest at zero counts (0 errors
in 80 rows does not prove a rate below one percent); paired error rates use the per-row differences.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

BOOTSTRAP_MAX_ROWS = 20_000
_CHUNK_ELEMENTS = 4_000_000  # resampled indices held at once (32 MB)


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided confidence interval, how it was computed (`method`, the same words
    for every scope it serves) and whether over paired rows."""

    estimate: float
    low: float
    high: float
    method: str
    paired: bool


@dataclass(frozen=True)
class Sums:
    """Per-row numerators and denominators of one side's ratio of sums (rows in a fixed order)."""

    x: np.ndarray  # (n,) float64
    y: np.ndarray  # (n,) float64

    @property
    def ratio(self) -> float | None:
        total = float(self.y.sum())
        return float(self.x.sum()) / total if total > 0 else None


def scope_rng(seed: int, scope: str) -> np.random.Generator:
    """A generator per (seed, scope): a scope's interval does not depend on which other scopes exist."""
    return np.random.default_rng([seed, zlib.crc32(scope.encode("utf-8"))])


def ratio_difference(
    current: Sums, baseline: Sums, paired: bool, level: float, rng: np.random.Generator, replicates: int = 2000
) -> Interval | None:
    """Interval of R_current - R_baseline; None when a side has nothing in its denominator."""
    r_c, r_b = current.ratio, baseline.ratio
    if r_c is None or r_b is None:
        return None
    if paired and len(current.x) != len(baseline.x):
        raise ValueError("paired samples must have the same rows")
    if max(len(current.x), len(baseline.x)) <= BOOTSTRAP_MAX_ROWS:
        low, high = _bootstrap(current, baseline, paired, level, rng, replicates)
        method = f"percentile bootstrap over rows, {replicates} resamples"
    else:
        low, high = _delta(current, baseline, paired, level, r_c, r_b)
        method = "delta method (linearised ratio of sums)"
    return Interval(r_c - r_b, low, high, method, paired)


def _bootstrap(
    current: Sums, baseline: Sums, paired: bool, level: float, rng: np.random.Generator, replicates: int
) -> tuple[float, float]:
    draws = []
    n_c, n_b = len(current.x), len(baseline.x)
    per_chunk = max(1, _CHUNK_ELEMENTS // max(n_c, n_b, 1))
    for start in range(0, replicates, per_chunk):
        b = min(per_chunk, replicates - start)
        index_c = rng.integers(0, n_c, (b, n_c))  # (b, n_c)
        index_b = index_c if paired else rng.integers(0, n_b, (b, n_b))  # (b, n_b)
        draws.append(_ratios(current, index_c) - _ratios(baseline, index_b))
    d = np.concatenate(draws)  # (replicates,)
    d = d[np.isfinite(d)]
    alpha = 1 - level
    return float(np.quantile(d, alpha / 2)), float(np.quantile(d, 1 - alpha / 2))


def _ratios(side: Sums, index: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return side.x[index].sum(axis=1) / side.y[index].sum(axis=1)  # (b,)


def _delta(current: Sums, baseline: Sums, paired: bool, level: float, r_c: float, r_b: float) -> tuple[float, float]:
    """Var(R) ~ Var(x_i - R y_i) / (n mean(y)^2): the influence of each row on the ratio."""
    influence_c = (current.x - r_c * current.y) / current.y.mean()  # (n_c,)
    influence_b = (baseline.x - r_b * baseline.y) / baseline.y.mean()  # (n_b,)
    if paired:
        variance = np.var(influence_c - influence_b, ddof=1) / len(influence_c)
    else:
        variance = np.var(influence_c, ddof=1) / len(influence_c) + np.var(influence_b, ddof=1) / len(influence_b)
    half = NormalDist().inv_cdf(0.5 + level / 2) * float(np.sqrt(variance))
    return r_c - r_b - half, r_c - r_b + half


def wilson(successes: int, n: int, level: float) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion_difference(errors_c: int, n_c: int, errors_b: int, n_b: int, level: float) -> Interval:
    """Newcombe's hybrid score interval (method 10) of p_current - p_baseline, independent samples."""
    p_c, p_b = errors_c / n_c, errors_b / n_b
    l_c, u_c = wilson(errors_c, n_c, level)
    l_b, u_b = wilson(errors_b, n_b, level)
    d = p_c - p_b
    low = d - np.sqrt((p_c - l_c) ** 2 + (u_b - p_b) ** 2)
    high = d + np.sqrt((u_c - p_c) ** 2 + (p_b - l_b) ** 2)
    return Interval(d, float(low), float(high), "Newcombe hybrid score interval", paired=False)
