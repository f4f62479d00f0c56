"""What the pairwise-joints workload is asked for and what it sums, in plain Python (no torch), so the
driver (`workflows.joints`, the workload's options, the Python API, the CLI) reads options and reports
without importing the engine in `joints.py`.

`JointOptions` choose HCB's pivot and AG's iterations; `PairMetrics` are one example's figures for one
construction; `JointStats` sums them over examples (`a + b` merges shards) and computes the corpus
figures once from the sums.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from ..errors import UserError
from ..measures import pppl
from ..options import check, option

CONSTRUCTIONS = ("MLM", "MRF", "MRF-L", "HCB", "AG")
PIVOTS = ("mode", "unary", "gold", "mask")


@dataclass(frozen=True)
class JointOptions:
    """How HCB picks its pivot and how long AG runs.

    `pivot` is the HCB pivot value of a (eq. 3 takes a first; the pivot value of b cancels in the
    normalisation): `mode`, the mode of the MLM joint as in the paper's experiments (the argmax of
    q(a | rest)); `unary`, the argmax of q(a | b = gold, rest) (the paper code's `one`); `gold`, the
    sentence's own token; `mask`, the [MASK] token, with which q(b | a = [MASK], rest) is the both-masked
    marginal; or a token id.
    """

    pivot: str | int = option(
        "mode",
        "HCB pivot: mode of the MLM joint (default), mask, the gold token, or the unary mode",
        choices=PIVOTS,
        name="--hcb-pivot",
    )
    ag_iterations: int = option(50, "Arnold-Gokhale iterations (default {default})", low=1)

    def __post_init__(self) -> None:
        check(self)
        if isinstance(self.pivot, int) and self.pivot < 0:
            raise UserError(f"HCB pivot token id must be non-negative, got {self.pivot}")


@dataclass(frozen=True)
class PairMetrics:
    """Sec. 3's per-example quantities for one construction (natural log)."""

    log_pair: float  # log q'(w_a, w_b | rest)
    log_unary_a: float  # log q'(w_a | w_b, rest)
    log_unary_b: float  # log q'(w_b | w_a, rest)
    a_kl: float  # (mean_v D(S, v) + mean_v D(S_r, v)) / 2
    g_kl: float  # (D(S, w_b) + D(S_r, w_a)) / 2


@dataclass(frozen=True)
class JointStats:
    """Summable statistics of one construction over examples; `a + b` merges shards.

    P-PPL = exp(-sum log q'(w_a, w_b) / 2N), U-PPL = exp(-sum of both unary log-probabilities / 2N),
    A-KL and G-KL the mean over examples of the per-example figures (sec. 3).
    """

    n: int = 0
    sum_log_pair: float = 0.0
    sum_log_unary: float = 0.0
    sum_a_kl: float = 0.0
    sum_g_kl: float = 0.0

    @classmethod
    def of(cls, m: PairMetrics) -> "JointStats":
        return cls(1, m.log_pair, m.log_unary_a + m.log_unary_b, m.a_kl, m.g_kl)

    def __add__(self, other: "JointStats") -> "JointStats":
        return JointStats(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple:
        return (self.n, self.sum_log_pair, self.sum_log_unary, self.sum_a_kl, self.sum_g_kl)

    @property
    def p_ppl(self) -> float | None:
        return pppl(self.sum_log_pair, 2 * self.n)

    @property
    def u_ppl(self) -> float | None:
        return pppl(self.sum_log_unary, 2 * self.n)

    @property
    def a_kl(self) -> float | None:
        return self.sum_a_kl / self.n if self.n else None

    @property
    def g_kl(self) -> float | None:
        return self.sum_g_kl / self.n if self.n else None

    def to_dict(self) -> dict:
        return {**asdict(self), "p_ppl": self.p_ppl, "u_ppl": self.u_ppl, "a_kl": self.a_kl, "g_kl": self.g_kl}


def corpus_stats(examples: Iterable[Mapping[str, PairMetrics]]) -> dict[str, JointStats]:
    """Per construction, the sum of every example's statistics."""
    totals = {name: JointStats() for name in CONSTRUCTIONS}
    for metrics in examples:
        for name, m in metrics.items():
            totals[name] = totals[name] + JointStats.of(m)
    return totals
