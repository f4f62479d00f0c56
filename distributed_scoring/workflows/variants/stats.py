"""How well a strategy's scores rank an assay's measurements: Spearman's rho with `DMS_score`, the AUC of
`DMS_score_bin` (the chance that a functional variant outscores a non-functional one), each with a percentile
bootstrap interval over the variants. Numpy only: ranks with ties averaged, as scipy's `rankdata` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

BOOTSTRAP = 1000  # resamples per interval
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A statistic, its bootstrap interval and the variants it was computed on."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict:
        return {"value": self.value, "interval": [self.low, self.high], "level": LEVEL, "n": self.n}


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    mean_rank = (starts + ends + 1) / 2.0  # ranks start..end-1 (0-based) -> their mean, 1-based
    out = np.empty(len(x))
    out[order] = np.repeat(mean_rank, ends - starts)
    return out


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's correlation of the ranks; None when either side is constant or has fewer than 2 values (as scipy's
    `spearmanr`, so that the value is ProteinGym's too)."""
    if len(x) < 2:
        return None
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return None if denominator == 0 else float((rx * ry).sum() / denominator)


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative) + P(tie) / 2 (Mann-Whitney); None without both classes."""
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    r = ranks(scores)
    return float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def estimate(statistic: Callable[[np.ndarray, np.ndarray], float | None], x: np.ndarray, y: np.ndarray) -> Estimate:
    """The statistic on all pairs, and the percentile interval of its values on BOOTSTRAP resamples of them."""
    value = statistic(x, y)
    if value is None:
        return Estimate(None, None, None, len(x))
    rng = np.random.default_rng(SEED)
    values = []
    for _ in range(BOOTSTRAP):  # one resample at a time: 10^3 x 10^5 indices at once would be 800 MB
        i = rng.integers(0, len(x), size=len(x))
        values.append(statistic(x[i], y[i]))
    kept = np.asarray([v for v in values if v is not None])
    alpha = (1 - LEVEL) / 2
    low, high = np.quantile(kept, [alpha, 1 - alpha]) if len(kept) else (None, None)
    return Estimate(value, None if low is None else float(low), None if high is None else float(high), len(x))
