"""Confidence intervals of the audit: golden values, agreement of the two methods, and coverage."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_scoring.workflows.audit import intervals as I
from distributed_scoring.workflows.audit.intervals import (
    Sums,
    proportion_difference,
    ratio_difference,
    scope_rng,
    wilson,
)


def sample(rng: np.random.Generator, n: int, level: float) -> Sums:
    """Sentences of 20-40 tokens whose NLL per token varies around `level` (a ratio-of-sums estimator)."""
    tokens = rng.integers(20, 41, n).astype(np.float64)
    nll = rng.gamma(4.0, level / 4.0, n)  # per-sentence NLL per token, mean `level`
    return Sums(-nll * tokens, tokens)


def test_newcombe_hybrid_score_interval_matches_the_paper():
    """Newcombe (1998), Table II, example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339."""
    interval = proportion_difference(56, 70, 48, 80, 0.95)
    assert interval.estimate == pytest.approx(0.2)
    assert (interval.low, interval.high) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert wilson(0, 10, 0.95) == pytest.approx((0.0, 0.2775), abs=5e-5)  # Newcombe's Table I, 0/10


def test_identical_paired_samples_give_a_zero_width_interval():
    side = sample(np.random.default_rng(0), 50, 2.0)
    interval = ratio_difference(side, side, True, 0.95, scope_rng(0, "x"))
    assert interval.estimate == 0 and interval.low == pytest.approx(0) and interval.high == pytest.approx(0)
    assert interval.paired and "bootstrap" in interval.method


def test_bootstrap_and_delta_method_agree_on_a_large_sample(monkeypatch):
    rng = np.random.default_rng(1)
    a, b = sample(rng, 5000, 2.0), sample(rng, 5000, 2.1)
    boot = ratio_difference(a, b, False, 0.95, scope_rng(0, "x"))
    monkeypatch.setattr(I, "BOOTSTRAP_MAX_ROWS", 100)
    delta = ratio_difference(a, b, False, 0.95, scope_rng(0, "x"))
    assert "bootstrap" in boot.method and "delta" in delta.method
    width = delta.high - delta.low
    assert abs(boot.low - delta.low) < 0.05 * width and abs(boot.high - delta.high) < 0.05 * width


@pytest.mark.parametrize("bootstrap_max_rows", [I.BOOTSTRAP_MAX_ROWS, 0])
@pytest.mark.parametrize("paired", [False, True])
def test_intervals_cover_the_true_difference_at_their_level(monkeypatch, bootstrap_max_rows, paired):
    """300 simulated nights of 150 sentences each: a 90 % interval must hold the true difference about 90 %
    of the time (binomial sd 1.7 %; we allow 83-96 %)."""
    monkeypatch.setattr(I, "BOOTSTRAP_MAX_ROWS", bootstrap_max_rows)
    rng = np.random.default_rng(2)
    # R = sum(-nll * tokens) / sum(tokens) has the population value -level: unpaired nights differ by
    # -2.2 - (-2.0); paired, every sentence's NLL rises by 10 % on average, so R moves by 0.1 * -2.0.
    truth = -0.2
    hits = 0
    for trial in range(300):
        base = sample(rng, 150, 2.0)
        now = Sums(base.x * rng.normal(1.1, 0.05, 150), base.y) if paired else sample(rng, 150, 2.2)
        interval = ratio_difference(now, base, paired, 0.90, np.random.default_rng(trial), replicates=400)
        hits += interval.low <= truth <= interval.high
    assert 0.83 <= hits / 300 <= 0.96, hits
