"""How the weights are tuned: the options (`RescoreOptions`: the metric, the length-penalty exponents, the
grid) and the grid search on dev (`grid_search`), which widens the lambda range while the optimum sits on
its top edge and says when an optimum lies on an edge of what was searched (see `rescoring`'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from ...options import check, option
from .combine import Split
from .metrics import Metric

METRICS = ("wer", "bleu")
BLEU_ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # LM length-penalty exponents searched for BLEU
# Bounds of the tuning flags: a length-penalty exponent past 10 overflows ((5 + |Y|) / 6) ** alpha for long
# hypotheses, and an LM weight past 1000 leaves the sequence model's score no say (the grid would be huge).
MAX_ALPHA = 10.0
MAX_LAMBDA = 1000.0
EXTENSION_POINTS = 20  # lambda values added each time the range is doubled


@dataclass(frozen=True)
class RescoreOptions:
    """How hypotheses are combined and how the weights are tuned (see `rescoring`'s docstring).

    `metric`: `wer` (ASR, minimised) or `bleu` (MT, maximised). `mlm_alpha`, `causal_alpha`: GNMT
    length-penalty exponents of the LM scores; None means 0 for WER and searched over `BLEU_ALPHAS` for
    BLEU. `seq_alpha` normalises the sequence score (0 for ASR, 0.6 for NMT in the paper). Lambda runs
    over 0, step, ..., lambda_max, extended up to `lambda_limit` while the dev optimum sits on the top
    edge; gamma over 0, step, ..., 1 when both LMs are given. `bleu_tokenize` is sacrebleu's tokenizer
    (`none` for text that is already tokenised, as the paper's tokenised BLEU). The fields that are
    `dscore rescore`'s flags declare them (help, choices, bounds); the steps and `bleu_lowercase` are not flags.
    """

    metric: str = option("wer", "wer (ASR, minimised) or bleu (MT, maximised)", choices=METRICS)
    mlm_alpha: float | None = option(
        None,
        "GNMT length-penalty exponent on the PLL (default: 0 for wer; searched on dev for bleu)",
        low=0,
        high=MAX_ALPHA,
        type=float,
    )
    causal_alpha: float | None = option(
        None,
        "GNMT length-penalty exponent on log P (default: 0 for wer; searched on dev for bleu)",
        low=0,
        high=MAX_ALPHA,
        type=float,
    )
    seq_alpha: float = option(
        0.0, "GNMT normalisation of the sequence model's score (0 off; 0.6 for NMT)", low=0, high=MAX_ALPHA
    )
    lambda_max: float = option(
        1.0,
        "top of the first LM-weight grid (default {default:g}; doubled while the optimum sits there)",
        low=0,
        high=MAX_LAMBDA,
    )
    lambda_limit: float = option(
        64.0, "largest LM weight the grid may be extended to (default {default:g})", low=0, high=MAX_LAMBDA
    )
    lambda_step: float = 0.05
    gamma_step: float = 0.1
    bleu_tokenize: str = option("13a", "sacrebleu tokenizer ('none' for tokenised text)")  # sacrebleu's names
    bleu_lowercase: bool = False

    def __post_init__(self) -> None:
        from sacrebleu.metrics import BLEU

        check(self)
        if not self.lambda_limit >= self.lambda_max:
            raise UserError(f"lambda_limit ({self.lambda_limit}) must be at least lambda_max ({self.lambda_max})")
        for name in ("lambda_step", "gamma_step"):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.bleu_tokenize not in BLEU.TOKENIZERS:
            raise UserError(f"bleu_tokenize {self.bleu_tokenize!r} is not one of sacrebleu's {sorted(BLEU.TOKENIZERS)}")

    def lambdas(self) -> np.ndarray:
        return _steps(self.lambda_max, self.lambda_step)

    def gammas(self, mlm: bool, causal: bool) -> np.ndarray:
        if mlm and causal:
            return _steps(1.0, self.gamma_step)
        return np.array([1.0 if mlm else 0.0])

    def alphas(self, mlm: bool, causal: bool) -> list[tuple[float, float]]:
        """The (mlm alpha, causal alpha) pairs searched: fixed where given, else 0 (WER) or `BLEU_ALPHAS`
        (BLEU) for every LM in use whose alpha is not given."""
        free = (mlm and self.mlm_alpha is None) or (causal and self.causal_alpha is None)
        searched = BLEU_ALPHAS if self.metric == "bleu" and free else (0.0,)
        return [
            (a if self.mlm_alpha is None else self.mlm_alpha, a if self.causal_alpha is None else self.causal_alpha)
            for a in searched
        ]


@dataclass(frozen=True)
class Search:
    """The dev grid (alpha, gamma, lambda) as finally searched, its best point and what lay on an edge."""

    lambdas: np.ndarray
    gammas: np.ndarray
    alphas: list[tuple[float, float]]
    grid: np.ndarray  # (n_alpha, n_gamma, n_lambda) corpus metric on dev
    best: tuple[float, float, tuple[float, float]]  # lambda, gamma, alphas
    edges: list[str]


def grid_search(split: Split, options: RescoreOptions, mlm: bool, causal: bool, metric: Metric) -> Search:
    """Grid search on dev. While the best lambda is the top of the range, the range is doubled (up to
    `options.lambda_limit`); the larger values are adopted only when one of them is strictly better, so a
    plateau of equal figures keeps its tie-rule choice instead of running to the limit."""
    lambdas, gammas, alphas = options.lambdas(), options.gammas(mlm, causal), options.alphas(mlm, causal)
    grid = _grid(split, lambdas, gammas, alphas, metric)
    adopted = len(lambdas)  # the best point is picked among lambdas[:adopted]
    best = _pick(grid[:, :, :adopted], lambdas, gammas, alphas, metric.higher_is_better)
    while best[2] == adopted - 1 and lambdas[-1] < options.lambda_limit:
        top = lambdas[-1]
        more = np.round(
            top + np.arange(1, EXTENSION_POINTS + 1) * (min(2 * top, options.lambda_limit) - top) / EXTENSION_POINTS, 10
        )
        lambdas = np.concatenate([lambdas, more])
        grid = np.concatenate([grid, _grid(split, more, gammas, alphas, metric)], axis=2)
        wider = _pick(grid, lambdas, gammas, alphas, metric.higher_is_better)
        if not _better(grid[wider], grid[best], metric):
            break
        adopted, best = len(lambdas), wider
    a, g, j = best
    edges = []
    if j == adopted - 1 and j > 0:
        if adopted == len(lambdas):
            edges.append(
                f"lambda = {lambdas[j]:g} is the largest weight searched (lambda_limit) and the dev metric "
                "was still improving there: the best weight may lie beyond it; raise --lambda-limit"
            )
        elif grid[a, g, adopted] == grid[a, g, j]:
            edges.append(
                f"lambda = {lambdas[j]:g} is the largest of the weights searched before a plateau of equally "
                f"good ones that goes on past it (searched up to {lambdas[-1]:g}, none better)"
            )
    if len(alphas) > 1 and a == len(alphas) - 1:
        edges.append(f"alpha = {alphas[a]} is the largest length-penalty exponent searched")
    return Search(lambdas, gammas, alphas, grid, (float(lambdas[j]), float(gammas[g]), alphas[a]), edges)


def _better(value: float, other: float, metric: Metric) -> bool:
    return value > other if metric.higher_is_better else value < other


def _grid(
    split: Split, lambdas: np.ndarray, gammas: np.ndarray, alphas: list[tuple[float, float]], metric: Metric
) -> np.ndarray:
    """(n_alpha, n_gamma, n_lambda) corpus metric of the split at every grid point."""
    out = np.empty((len(alphas), len(gammas), len(lambdas)))
    for a, pair in enumerate(alphas):
        for g, gamma in enumerate(gammas):
            lm = split.lm(gamma, pair)  # (U, N)
            for j, lam in enumerate(lambdas):
                out[a, g, j] = metric.corpus(split.totals(split.choose(lam, lm)))
    return out


def _pick(
    grid: np.ndarray, lambdas: np.ndarray, gammas: np.ndarray, alphas: list, higher_is_better: bool
) -> tuple[int, int, int]:
    """Indices (alpha, gamma, lambda) of the best grid point; among exact ties the largest lambda, then the
    largest gamma, then the smallest alpha (appendix A)."""
    objective = grid if higher_is_better else -grid
    found = np.argwhere(objective == objective.max())  # (k, 3)
    a, g, j = max(found.tolist(), key=lambda i: (lambdas[i[2]], gammas[i[1]], -i[0]))
    return a, g, j


def _steps(top: float, step: float) -> np.ndarray:
    """0, step, 2 step, ..., up to `top` inclusive, rounded so that 0.35 prints as 0.35."""
    return np.round(np.arange(int(np.floor(top / step + 1e-9)) + 1) * step, 10)
