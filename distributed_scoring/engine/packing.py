"""One packer of rows into forward passes under a token budget, and one way to survive running out of memory.

Every engine scores *groups* of rows of equal length: a sentence's masked copies (PLL), a sequence
alone (causal LM), the rows of one example that differ in one token (conditionals). Groups are taken
longest first, so a batch's first row sets its padded width and the rows after it are no longer; a
group may run over several batches. The budget bounds rows x padded width, and a batch always holds at
least one row, so a row longer than the budget goes alone.

A batch that runs out of device memory halves the engine's budget for the rest of the run and is
re-packed into smaller batches and retried; only a single row that does not fit is an error. This module
deals in lengths and indices only: the engines pass in the error type of their device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Piece:
    """Rows start..end of one group, consecutive in a batch."""

    group: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass
class TokenBudget:
    """Rows x padded width allowed in one forward pass; lowered when a batch runs out of memory."""

    tokens: int

    def halve(self) -> None:
        self.tokens = max(1, self.tokens // 2)


@dataclass(frozen=True)
class OutOfMemory:
    """The error a device raises when a forward pass does not fit, and how to free its cached memory."""

    error: type[BaseException]
    release: Callable[[], None]


def pack(lengths: Sequence[int], counts: Sequence[int], budget: TokenBudget) -> Iterator[list[Piece]]:
    """Batches covering every row of every group exactly once, longest groups first (stable).

    Group g has counts[g] rows of lengths[g] tokens. The budget is read at the start of each batch, so
    a budget halved while the batches are consumed applies to the batches after.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batch: list[Piece] = []
    rows = capacity = 0
    for group in order.tolist():
        start = 0
        while start < counts[group]:
            if not batch:
                capacity = max(1, budget.tokens // lengths[group])  # the first group sets the width
            take = min(capacity - rows, counts[group] - start)
            batch.append(Piece(group, start, start + take))
            rows += take
            start += take
            if rows == capacity:
                yield batch
                batch, rows = [], 0
    if batch:
        yield batch


def rows_of(batch: list[Piece]) -> int:
    return sum(piece.rows for piece in batch)


def run_fitting(
    batch: list[Piece],
    lengths: Sequence[int],
    budget: TokenBudget,
    forward: Callable[[list[Piece]], T],
    out_of_memory: OutOfMemory,
) -> list[tuple[list[Piece], T]]:
    """(part, forward(part)) for the parts of `batch` that fit in memory, in row order.

    On an out-of-memory error the budget is halved and the batch is re-packed under at most half its
    own tokens (so it always splits) and retried part by part; a single row that does not fit re-raises.
    `forward` may run the same rows again after it failed, so it must hand nothing out before it returns.
    """
    rows = rows_of(batch)
    try:
        return [(batch, forward(batch))]
    except out_of_memory.error:
        if rows == 1:
            raise
    # Retried outside the handler: the traceback would keep the failed pass's tensors alive.
    out_of_memory.release()
    budget.halve()
    logger.warning("out of memory on a batch of %d rows; token budget halved to %d", rows, budget.tokens)
    split = TokenBudget(min(budget.tokens, rows * lengths[batch[0].group] // 2))
    parts = _repack(batch, lengths, split)
    return [done for part in parts for done in run_fitting(part, lengths, budget, forward, out_of_memory)]


def _repack(batch: list[Piece], lengths: Sequence[int], budget: TokenBudget) -> Iterator[list[Piece]]:
    """`pack` applied to the pieces of one batch, in the original groups' row numbering."""
    for part in pack([lengths[p.group] for p in batch], [p.rows for p in batch], budget):
        yield [Piece(batch[p.group].group, batch[p.group].start + p.start, batch[p.group].start + p.end) for p in part]
