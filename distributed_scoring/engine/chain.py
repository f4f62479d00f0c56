"""Chain-rule log-likelihoods of a masked LM along an order (Liao et al., 2020, u-PMLM, eq. 8).

For a sequence x and an order sigma of some of its positions (the scored ones: special tokens excluded),

    log p(x) = sum_k log p(x_sigma(k) | x_sigma(<k), the positions sigma(>k) masked, the rest as given)

in natural log, the softmax over the whole vocabulary. Step k is one masked copy of the sequence, with
sigma(k) and every later position of the order holding the mask token (`masking`, variant `chain`), so a
sequence of T scored tokens costs T copies, as its PLL does. A u-PMLM is trained so that these are its
conditionals, and the sum is its likelihood of x in that order; for any other MLM the sum is only an
approximation (its conditionals were trained at one masking rate and need not form a joint).

The copies of every (sequence, order) pair of a call go through the PLL engine's packed forward passes
under one token budget (one group of rows per pair), with its out-of-memory halving; nothing here
batches or normalises on its own.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .masked_lm import MaskedLM
from .masking import Sentence
from .pll import PLLEngine


class ChainEngine:
    """Chain-rule log-likelihoods with one loaded model; results do not depend on the batching."""

    def __init__(self, mlm: MaskedLM, batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.pll = PLLEngine(mlm, "chain", batch_tokens)

    @property
    def batch_tokens(self) -> int:
        """The current token budget: the one given, halved after each batch that ran out of memory."""
        return self.pll.batch_tokens

    def log_likelihoods(
        self,
        input_ids: Sequence[np.ndarray],
        orders: Sequence[np.ndarray],
        report: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """(P,) float64: log p(input_ids[i]) along orders[i] (positions of input_ids[i], scoring order);
        `report` as in `PLLEngine.token_logprobs`."""
        return np.array([terms.sum() for terms in self.conditionals(input_ids, orders, report)], dtype=np.float64)

    def conditionals(
        self,
        input_ids: Sequence[np.ndarray],
        orders: Sequence[np.ndarray],
        report: Callable[[int, int], None] | None = None,
    ) -> list[np.ndarray]:
        """Per pair, the chain's terms log p(x_sigma(k) | x_sigma(<k), ...) for k = 0 .. T-1 (float64)."""
        if len(input_ids) != len(orders):
            raise ValueError(f"{len(input_ids)} sequences but {len(orders)} orders: give one order per sequence")
        sentences = []
        for ids, order in zip(input_ids, orders):
            ids, order = np.asarray(ids, dtype=np.int64), np.asarray(order, dtype=np.int64)
            if len(np.unique(order)) != len(order) or ((order < 0) | (order >= len(ids))).any():
                raise ValueError(f"an order must hold distinct positions of its sequence (0 .. {len(ids) - 1})")
            sentences.append(Sentence(ids, order, np.full(len(ids), -1, dtype=np.int64)))
        return self.pll.token_logprobs(sentences, report)
