"""The chain-rule workload (`dscore score --method chain`): log p(x) along an order (Liao et al., 2020).

Its prepare stage is the PLL's (`prepare.PLLPreparer`: the scored positions are the non-special tokens);
its score stage draws each row's orders (`l2r`, `r2l`, or `orders` random permutations seeded by the
run's seed and the row's id, so results do not depend on sharding) and scores every (row, order) pair
of the shard with `engine.chain`. With several orders the row's `log_likelihood` is the log of the mean
of their probabilities, log(1/K sum_k p_k(x)) (each order's chain is a distribution over x for a u-PMLM,
so the mean is one too); `log_likelihoods` keeps each order's value and `log_likelihood_std` their
spread. The rows keep the PLL's schema (`pll` and the PPPLs null, `variant` = `chain`), so outputs of
both methods can be read together. The engine (torch) is imported by the scorer on its actor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec, RowCost
from ..engine.orders import CHAIN_ORDERS, orders_for
from ..errors import UserError
from ..io import schema as S
from ..options import check, option
from ..pipeline.memory import ROW_BYTES, MemoryEstimate
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .infill import example_seed
from .pll import isolated, pll_preparer

METHOD, ORDER, LOG_LIKELIHOOD = "method", "order", "log_likelihood"
LOG_LIKELIHOODS, LOG_LIKELIHOOD_STD = "log_likelihoods", "log_likelihood_std"
CHAIN = "chain"  # the rows' method and variant
DECLARED = Declaration(CHAIN, engines=("engine.chain",), docs="docs/score.md")

CHAIN_FIELDS = [
    pa.field(METHOD, pa.string(), nullable=False),
    pa.field(ORDER, pa.string(), nullable=False),
    pa.field(LOG_LIKELIHOOD, pa.float64()),
    pa.field(LOG_LIKELIHOODS, pa.list_(pa.float64())),
    pa.field(LOG_LIKELIHOOD_STD, pa.float64()),
]


@dataclass(frozen=True)
class ChainOptions:
    """What changes a chain-scoring run's rows (every field enters the run's fingerprint)."""

    order: str = option(
        "l2r", "chain order: left to right (default), right to left, or random permutations", choices=CHAIN_ORDERS
    )
    orders: int = option(1, "random orders per sentence, averaged in probability space (default 1)", low=1)
    seed: int = option(0, "seed of the random orders, with each row's id (default 0)")
    split_chars: bool = False

    def __post_init__(self) -> None:
        check(self)
        if self.orders > 1 and self.order != "random":
            raise UserError(f"--orders {self.orders}: only --order random has more than one order")


def output_schema(partition: bool) -> pa.Schema:
    """The PLL's row schema (without its optional columns), the chain's columns, then `partition`."""
    fields = list(S.output_schema()) + CHAIN_FIELDS
    return pa.schema(fields + [S.PARTITION_FIELD] if partition else fields)


class ChainScorer(Stage):
    """Adds the chain log-likelihood (and each order's) to prepared rows; error rows pass through."""

    reads = {
        S.ID: "the row's id, kept (with the run's seed, it seeds the row's random orders)",
        S.TEXT: "the text, kept",
        S.STATUS: "ok, or error for a row that could not be read or tokenised (kept as an error row)",
        S.ERROR: "why the row could not be read or tokenised",
        S.INPUT_IDS: "the model's token ids, special tokens included",
        S.TARGETS: "the positions of input_ids to score (the non-special tokens)",
        S.N_WORDS: "the number of whitespace words (PPL per word)",
        S.N_UNKNOWN: "the number of targets that are the unknown token",
    }

    def __init__(self, model: ModelSpec, options: ChainOptions, batch_tokens: int | None = None) -> None:
        from ..engine.chain import ChainEngine
        from ..engine.masked_lm import load_masked_lm

        self.mlm = load_masked_lm(model)
        self.model_name, self.options = model.name, options
        self.engine = ChainEngine(self.mlm, batch_tokens)
        self.signature = {**self.mlm.signature, METHOD: CHAIN, ORDER: options.order}

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return output_schema(S.PARTITION in columns)

    def process(self, rows: list[Row]) -> list[Row]:
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        work = []
        for i in ok:
            rng = np.random.default_rng(example_seed(self.options.seed, rows[i][S.ID]))
            orders = orders_for(np.asarray(rows[i][S.TARGETS]), self.options.order, self.options.orders, rng)
            work.append((np.asarray(rows[i][S.INPUT_IDS], dtype=np.int64), orders))
        scored: list[np.ndarray | str | None] = [None] * len(rows)
        for i, result in zip(ok, isolated(self._score, work)):
            scored[i] = result
        return [self._row(row, result) for row, result in zip(rows, scored)]

    def _score(self, work: Sequence[tuple[np.ndarray, list[np.ndarray]]]) -> list[np.ndarray]:
        """(K,) log-likelihoods per row, every order of every row in one call of the engine."""
        values = self.engine.log_likelihoods(
            [ids for ids, orders in work for _ in orders],
            [order for _, orders in work for order in orders],
            self.report,
        )
        return np.split(values, np.cumsum([len(orders) for _, orders in work])[:-1])

    def _row(self, row: Row, result: np.ndarray | str | None) -> Row:
        """The output row of a prepared row and its orders' log-likelihoods (or error)."""
        error = result if isinstance(result, str) else row[S.ERROR]
        ok = error is None and result is not None
        values = result if ok else None
        out = {
            **row,
            S.PLL: None,
            S.N_TOKENS: len(row[S.TARGETS]) if ok else 0,
            S.N_WORDS: row[S.N_WORDS] if ok else 0,
            S.N_UNKNOWN: row[S.N_UNKNOWN] if ok else 0,
            S.PPPL_TOKEN: None,
            S.PPPL_WORD: None,
            S.STATUS: S.STATUS_OK if ok else S.STATUS_ERROR,
            S.ERROR: None if ok else error,
            S.MODEL: self.model_name,
            S.VARIANT: CHAIN,
            METHOD: CHAIN,
            ORDER: self.options.order,
            LOG_LIKELIHOOD: None,
            LOG_LIKELIHOODS: None,
            LOG_LIKELIHOOD_STD: None,
        }
        if ok:
            out.update(
                {
                    LOG_LIKELIHOOD: float(np.logaddexp.reduce(values) - math.log(len(values))),
                    LOG_LIKELIHOODS: values.tolist(),
                    LOG_LIKELIHOOD_STD: float(values.std()),
                }
            )
        return out


def memory_estimate(options: ChainOptions, shard_rows: int, tokens: int) -> MemoryEstimate:
    """What one shard holds at once: every order of every row (a permutation of its tokens, then its
    log-likelihood, kept in the row's `log_likelihoods`)."""
    per_row = ROW_BYTES + options.orders * (8 * tokens + 32)
    return MemoryEstimate(
        shard_rows * per_row, f"one shard of {shard_rows} rows x {options.orders:,} orders", "--orders or --shard-rows"
    )


def chain_workload(
    model: ModelSpec, options: ChainOptions, batch_tokens: int | None = None, cost: RowCost | None = None
) -> Workload:
    """Chain-rule log-likelihoods along an order (`dscore score --method chain`); `cost`: a row's
    (`pll.row_cost`, a pass a token and order)."""
    return DECLARED.workload(
        options,
        partial(pll_preparer, model, options.split_chars),
        partial(ChainScorer, model, options, batch_tokens),
        model.device,
        row_cost=cost,
    )
