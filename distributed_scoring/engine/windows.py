"""The PLL of a text longer than the model's window: each token scored in a window of the full width, centred on
it where the text allows (`--long-texts window`, docs/score.md "Long texts").

Let M be the model's maximum length, C = M minus the special tokens of one sequence (the prefix and suffix
around the text's n content tokens). Token i (0-based among the content tokens) is scored as
log p(x_i | specials + x[s : s + C] with x_i masked), s = min(max(i - C // 2, 0), n - C): every token once, nothing
truncated. Under `word_l2r` the window also holds the whole of the token's word (the pieces it masks and
those before them), shifted as little as that needs; a word longer than C tokens cannot be windowed.

The tokens that share a start s share one window: a long text becomes at most n - C + 1 windows, each an
ordinary `Sentence` of length M whose targets are those tokens, so the engine packs their masked copies into
its batches under its token budget like any others, n copies of length M in all. Numpy only: the PLL
scorer splits and stitches around the engine.

`proteingym_window` is ProteinGym's other convention, which `dscore variants --windows proteingym` follows
(docs/variants.md "ProteinGym's windows").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .masking import Sentence


@dataclass(frozen=True)
class Window:
    """One window of a long sentence: the sentence the engine scores, and which of the long sentence's
    targets (their indices in its target order) its targets are, in order."""

    sentence: Sentence
    slots: np.ndarray  # (k,) indices into the long sentence's targets


def window_start(i: int, n: int, c: int) -> int:
    """Where the window of content token `i` starts: centred on it, held inside the text."""
    return min(max(i - c // 2, 0), n - c)


PROTEINGYM_WIDTH = 1024  # compute_fitness.py's `model_window`, ESM's 1024 tokens, whatever the model states


def proteingym_window(position: int, length: int, width: int) -> tuple[int, int]:
    """[start, end) of the tokens ProteinGym's ESM script (`get_optimal_window` in its `scoring_utils.py`)
    feeds the model for the masked token at `position` of a sequence of `length` tokens, special tokens
    counted in both, `width` the model's maximum: kept so that `--windows proteingym` gives its numbers.
    Unlike `window_start`, the slice is of the tokens themselves: it holds the leading special token only when
    it starts at 0 and the trailing one only when it ends at `length`, so a middle window has none; and a
    middle window is `position` +- width // 2, which is width - 1 tokens when `width` is odd. ProteinGym's width
    is PROTEINGYM_WIDTH, also for ESM-2, whose configuration states 1026 positions; a model of fewer takes its own."""
    half = width // 2
    if length <= width:
        return 0, length
    if position < half:
        return 0, width
    if position >= length - half:
        return length - width, length
    return max(0, position - half), min(length, position + half)


def split(sentence: Sentence, max_length: int, variant: str) -> list[Window] | str:
    """The windows of a sentence longer than `max_length`, or why it has none (an error row's message)."""
    ids, targets = sentence.input_ids, sentence.targets
    first, last = int(targets[0]), int(targets[-1])
    if not np.array_equal(targets, np.arange(first, last + 1)):
        return "the text's tokens are not one run between the special tokens, so it cannot be windowed"
    prefix, suffix = ids[:first], ids[last + 1 :]
    c = max_length - len(prefix) - len(suffix)
    n = len(targets)
    if c < 1:
        return f"the model's maximum of {max_length} tokens leaves no room for text beside its special tokens"
    words = sentence.piece_words[first : last + 1]
    starts = np.empty(n, dtype=np.int64)
    for i in range(n):
        s = window_start(i, n, c)
        if variant == "word_l2r" and words[i] >= 0:
            same = np.flatnonzero(words == words[i])
            low, high = int(same[0]), int(same[-1])
            if high - low + 1 > c:
                return (
                    f"a word of {high - low + 1} tokens is longer than the model's window of {c} text tokens, "
                    "so word_l2r cannot keep it in one window: use --variant original"
                )
            s = min(max(s, high - c + 1), low)
        starts[i] = s
    windows = []
    for s in np.unique(starts):
        slots = np.flatnonzero(starts == s)
        inside = slice(first + s, first + s + c)
        windows.append(
            Window(
                Sentence(
                    input_ids=np.concatenate([prefix, ids[inside], suffix]),
                    targets=len(prefix) + slots - s,
                    piece_words=np.concatenate(
                        [sentence.piece_words[:first], sentence.piece_words[inside], sentence.piece_words[last + 1 :]]
                    ),
                ),
                slots,
            )
        )
    return windows


def stitch(n: int, windows: list[Window], results: list[Any]) -> Any:
    """The long sentence's per-target results (n rows) from its windows' (each an array with a row per target of
    the window, or a dataclass of such arrays, as `pll.Conditionals`), in its target order."""
    first = results[0]
    if isinstance(first, np.ndarray):
        out = np.empty((n, *first.shape[1:]), dtype=first.dtype)
        for window, values in zip(windows, results):
            out[window.slots] = values
        return out
    return type(first)(**{f.name: stitch(n, windows, [getattr(r, f.name) for r in results]) for f in fields(first)})
