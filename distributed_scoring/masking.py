"""Masked copies of sentences and their packing into forward passes under a token budget.

A sentence of length L with n scored tokens becomes n copies of length L, copy k masking target k
(and, in the `word_l2r` variant, the later pieces of the same word). Copies of many sentences share a
forward pass: sentences are sorted by length, longest first, so every batch pads to nearly its own
length, and a sentence whose copies exceed the budget is split over several batches. The budget bounds
rows x padded length; a batch always holds at least one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np


@dataclass(frozen=True)
class Sentence:
    """The engine's view of one prepared sentence (see `prepare.Prepared`)."""

    input_ids: np.ndarray  # (L,) token ids, special tokens included
    targets: np.ndarray  # (n,) positions to mask and score
    piece_words: np.ndarray  # (L,) tokenizer word id per token, -1 for specials


@dataclass(frozen=True)
class MaskedBatch:
    """One forward pass worth of masked copies, as CPU arrays."""

    input_ids: np.ndarray  # (B, T) int64, padded on the right
    attention_mask: np.ndarray  # (B, T) int64
    positions: np.ndarray  # (B,) the scored position of each row
    labels: np.ndarray  # (B,) the original token at that position
    sentence: np.ndarray  # (B,) index of the row's sentence in the input sequence
    slot: np.ndarray  # (B,) index of the row's target within its sentence

    def __len__(self) -> int:
        return len(self.positions)

    def halves(self) -> tuple["MaskedBatch", "MaskedBatch"]:
        """The first and second half of the rows (for retrying a batch that ran out of memory)."""
        middle = len(self) // 2
        return tuple(MaskedBatch(*(a[part] for a in self.astuple())) for part in (slice(None, middle), slice(middle, None)))

    def astuple(self) -> tuple[np.ndarray, ...]:
        return (self.input_ids, self.attention_mask, self.positions, self.labels, self.sentence, self.slot)


def mask_matrix(sentence: Sentence, variant: str) -> np.ndarray:
    """(n, L) bool: row k marks the positions masked in copy k.

    `original`: the target alone. `word_l2r` (Kauf & Ivanova, 2023): the target and every later piece
    of the same tokenizer word, so a word's first piece is not predicted from its own continuation.
    """
    length = len(sentence.input_ids)
    pos = np.arange(length)
    t = sentence.targets
    mask = pos[None, :] == t[:, None]
    if variant == "word_l2r":
        words = sentence.piece_words
        same_word = (words[None, :] == words[t][:, None]) & (words[None, :] >= 0)
        mask |= same_word & (pos[None, :] > t[:, None])
    return mask


def pack(
    sentences: Sequence[Sentence],
    variant: str,
    batch_tokens: int,
    mask_id: int,
    pad_id: int,
) -> Iterator[MaskedBatch]:
    """Yield batches covering every (sentence, target) exactly once."""
    order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i].input_ids))
    pending: list[tuple[int, int, int]] = []  # (sentence index, first target, end target)
    rows = 0
    width = 0
    capacity = 0
    for index in order:
        n_targets = len(sentences[index].targets)
        length = len(sentences[index].input_ids)
        start = 0
        while start < n_targets:
            if not pending:
                width = length  # longest first: the first sentence of a batch sets its width
                capacity = max(1, batch_tokens // width)
            take = min(capacity - rows, n_targets - start)
            pending.append((index, start, start + take))
            rows += take
            start += take
            if rows == capacity:
                yield _build(sentences, pending, width, variant, mask_id, pad_id)
                pending, rows = [], 0
    if pending:
        yield _build(sentences, pending, width, variant, mask_id, pad_id)


def _build(
    sentences: Sequence[Sentence],
    pieces: list[tuple[int, int, int]],
    width: int,
    variant: str,
    mask_id: int,
    pad_id: int,
) -> MaskedBatch:
    n_rows = sum(end - start for _, start, end in pieces)
    input_ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    attention = np.zeros((n_rows, width), dtype=np.int64)
    positions = np.empty(n_rows, dtype=np.int64)
    labels = np.empty(n_rows, dtype=np.int64)
    sentence_of = np.empty(n_rows, dtype=np.int64)
    slot = np.empty(n_rows, dtype=np.int64)
    row = 0
    for index, start, end in pieces:
        s = sentences[index]
        length = len(s.input_ids)
        block = slice(row, row + end - start)
        masked = mask_matrix(s, variant)[start:end]  # (k, L)
        input_ids[block, :length] = np.where(masked, mask_id, s.input_ids[None, :])
        attention[block, :length] = 1
        positions[block] = s.targets[start:end]
        labels[block] = s.input_ids[s.targets[start:end]]
        sentence_of[block] = index
        slot[block] = np.arange(start, end)
        row += end - start
    return MaskedBatch(input_ids, attention, positions, labels, sentence_of, slot)
