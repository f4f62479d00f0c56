"""One packer of rows into forward passes under a token budget, and one way to survive running out of memory.

Every engine scores *groups* of rows of equal length: a sentence's masked copies (PLL), a sequence
alone (causal LM), the rows of one example that differ in one token (conditionals). Groups are taken
longest first, so a batch's first row sets its padded width and the rows after it are no longer; a
group may run over several batches. The budget bounds rows x padded width, and a batch always holds at
least one row, so a row longer than the budget goes alone.

Filled to the budget, a batch of one-row groups of widely spread lengths (sentences read once, unmasked)
is mostly padding: 546 rows under 65,536 tokens start at a 120-token sentence and reach down to 15-token
ones. A `padding` limit closes a batch before it runs more than `padding` tokens per real token, so
batches hold rows of similar length; `Work` counts what a run of batches executed and how much of it was
useful.

A batch that runs out of device memory halves the engine's budget for the rest of the run and is
re-packed into smaller batches and retried; only a single row that does not fit is an error. This module
deals in lengths and indices only: the engines pass in the error type of their device.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The most tokens a batch of sentences read once (one row each) may run per real token. On LibriSpeech-like
# lengths (lognormal, median 20 tokens, up to ~120) batches filled to the budget ran 1.06 (1,024 tokens) and
# 3.24 (65,536) tokens per real one; under this limit 1.05 and 1.10, in 28 and 16 batches per 1,000 sentences
# (a limit of 1.15 gave 1.05 and 1.15 in 27 and 12; 1.05 gave 1.03 and 1.05 in 35 and 26).
ONE_PASS_PADDING = 1.1


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


def pack(
    lengths: Sequence[int], counts: Sequence[int], budget: TokenBudget, padding: float | None = None
) -> Iterator[list[Piece]]:
    """Batches covering every row of every group exactly once, longest groups first (stable).

    Group g has counts[g] rows of lengths[g] tokens. The budget is read at the start of each batch, so
    a budget halved while the batches are consumed applies to the batches after. With `padding` (>= 1),
    no batch runs more than `padding` padded tokens per real token: a batch closes early rather than take
    rows much shorter than its first.
    """
    if padding is not None and padding < 1:
        raise ValueError(f"padding is padded tokens per real token, at least 1: got {padding}")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batch: list[Piece] = []
    rows = capacity = width = useful = 0
    for group in order.tolist():
        start = 0
        while start < counts[group]:
            if not batch:
                width = lengths[group]  # the first group sets the width
                capacity = max(1, budget.tokens // width)
            take = min(
                capacity - rows, counts[group] - start, _rows_within(padding, width, rows, useful, lengths[group])
            )
            if take == 0:  # this group's rows would pad the batch beyond the limit: it starts the next one
                yield batch
                batch, rows, useful = [], 0, 0
                continue
            batch.append(Piece(group, start, start + take))
            rows += take
            useful += take * lengths[group]
            start += take
            if rows == capacity:
                yield batch
                batch, rows, useful = [], 0, 0
    if batch:
        yield batch


def _rows_within(padding: float | None, width: int, rows: int, useful: int, length: int) -> int | float:
    """The most rows of `length` tokens a batch of `rows` rows, `useful` real tokens and padded `width` can
    take with (rows + t) * width <= padding * (useful + t * length); unbounded without a limit."""
    if padding is None or width <= padding * length:
        return math.inf
    return max(0, math.floor((padding * useful - rows * width) / (width - padding * length)))


def rows_of(batch: list[Piece]) -> int:
    return sum(piece.rows for piece in batch)


@dataclass(frozen=True)
class Work:
    """What batches cost: model calls, rows, tokens run (rows x padded width) and real tokens. Sums with `+`,
    so an engine adds up each batch's and a caller reads `padding`, executed/useful, off the total."""

    batches: int = 0
    rows: int = 0
    executed: int = 0
    useful: int = 0

    @classmethod
    def of(cls, batch: list[Piece], lengths: Sequence[int]) -> Work:
        """One batch's work; its first group is its longest (`pack`), so its length is the padded width."""
        rows = rows_of(batch)
        return cls(1, rows, rows * lengths[batch[0].group], sum(p.rows * lengths[p.group] for p in batch))

    def __add__(self, other: Work) -> Work:
        return Work(
            self.batches + other.batches,
            self.rows + other.rows,
            self.executed + other.executed,
            self.useful + other.useful,
        )

    @property
    def padding(self) -> float:
        """Tokens run per real token (1.0 means no padding; 1.0 too when nothing ran)."""
        return self.executed / self.useful if self.useful else 1.0


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
