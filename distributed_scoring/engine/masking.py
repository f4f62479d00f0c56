"""Masked copies of sentences and their packing into forward passes under a token budget.

A sentence of length L with n scored tokens becomes n copies of length L, copy k masking target k
(and, in the `word_l2r` variant, the later pieces of the same word; in `chain`, the later targets).
Copies of many sentences share a forward pass, packed by `packing.pack` (a sentence is a group of rows:
longest first, a sentence's copies may run over several batches, rows x padded length within the budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..engine import packing
from .packing import Piece, TokenBudget, rows_of


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


def mask_matrix(sentence: Sentence, variant: str) -> np.ndarray:
    """(n, L) bool: row k marks the positions masked in copy k.

    `original`: the target alone. `word_l2r` (Kauf & Ivanova, 2023): the target and every later piece
    of the same tokenizer word, so a word's first piece is not predicted from its own continuation.
    `chain` (the chain rule along an order, `engine.chain`): the targets are the order, and copy k masks
    target k and every target after it, so it sees the targets before it and the rest of the sentence.
    """
    length = len(sentence.input_ids)
    pos = np.arange(length)
    t = sentence.targets
    if variant == "chain":
        rank = np.full(length, -1)
        rank[t] = np.arange(len(t))  # step at which each position is scored; -1: never (context)
        return rank[None, :] >= np.arange(len(t))[:, None]
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
    lengths, counts = shape_of(sentences)
    for pieces in packing.pack(lengths, counts, TokenBudget(batch_tokens)):
        yield build(sentences, pieces, variant, mask_id, pad_id)


def shape_of(sentences: Sequence[Sentence]) -> tuple[list[int], list[int]]:
    """(length, number of masked copies) of each sentence: the groups `packing.pack` takes."""
    return [len(s.input_ids) for s in sentences], [len(s.targets) for s in sentences]


def build(
    sentences: Sequence[Sentence],
    pieces: list[Piece],
    variant: str,
    mask_id: int,
    pad_id: int,
) -> MaskedBatch:
    """The masked copies of `pieces` (a group is a sentence, a row one of its targets), padded to the
    first (longest) sentence."""
    n_rows = rows_of(pieces)
    width = len(sentences[pieces[0].group].input_ids)
    input_ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    attention = np.zeros((n_rows, width), dtype=np.int64)
    positions = np.empty(n_rows, dtype=np.int64)
    labels = np.empty(n_rows, dtype=np.int64)
    sentence_of = np.empty(n_rows, dtype=np.int64)
    slot = np.empty(n_rows, dtype=np.int64)
    row = 0
    for piece in pieces:
        s, copies = sentences[piece.group], slice(piece.start, piece.end)
        length = len(s.input_ids)
        block = slice(row, row + piece.rows)
        masked = mask_matrix(s, variant)[copies]  # (k, L)
        input_ids[block, :length] = np.where(masked, mask_id, s.input_ids[None, :])
        attention[block, :length] = 1
        positions[block] = s.targets[copies]
        labels[block] = s.input_ids[s.targets[copies]]
        sentence_of[block] = piece.group
        slot[block] = np.arange(piece.start, piece.end)
        row += piece.rows
    return MaskedBatch(input_ids, attention, positions, labels, sentence_of, slot)
