"""The PLL's prepare stage (`PLLPreparer`): tokenise read rows into the columns the PLL engine needs (chain
scoring, joints and the maskless students read the same columns).

It needs the tokenizer only, never the model, so the Ray pipeline runs it on CPU tasks beside the
scoring actors. Rows that cannot be scored (empty, too long, nothing to score) leave as error rows;
nothing is truncated.

A very long text is not tokenised whole at first (a 10 MB line once took 2.6 GiB): its words that end
within `max_length * PROBE_CHARS_PER_TOKEN` characters are tokenised first, and when they alone are over
the maximum the row is an error. That never refuses a text that fits: the tokenizers here (WordPiece,
byte-level BPE, SentencePiece) split text at whitespace before anything else, so a text has at least
as many tokens as any run of its first whole words (tests/workloads/test_prepare.py checks it on every
family). Only when the probe is not over (much whitespace, one giant word) is the whole text tokenised.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Sequence

import pyarrow as pa

from ..io import schema as S
from ..pipeline.stage import Row, Stage

_WORD = re.compile(r"\S+")
# Characters per allowed token beyond which a text is probed first. Real text averages 3 to 6; the value
# only decides how early an over-long text is caught, never whether a row fits.
PROBE_CHARS_PER_TOKEN = 16
# With windows, the longest text scored is this many times the model's maximum (51,200 tokens for BERT's 512):
# its cost is a pass of the full width per token, and a whole book in one row is more likely a reading mistake.
WINDOWED_LIMIT = 100


@dataclass(frozen=True)
class Prepared:
    """One tokenised sentence, or the reason it cannot be scored."""

    input_ids: list[int] | None = None
    targets: list[int] | None = None
    piece_words: list[int] | None = None
    target_words: list[int] | None = None
    n_words: int = 0
    n_unknown: int = 0
    error: str | None = None


def whitespace_words(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words: the unit of `n_words` and word scores."""
    return [m.span() for m in _WORD.finditer(text)]


def _too_long(length: str, max_length: int, long_texts: str | None = None) -> Prepared:
    """The error row of a text over the longest one scored; `length` says how long it is. `long_texts` as
    `PLLPreparer`'s: under `error` the row names `--long-texts window`, the way to score it."""
    if long_texts == "window":
        return Prepared(
            error=f"{length}, over the {WINDOWED_LIMIT} windows of the model's {max_length} tokens that "
            "--long-texts window scores in one row; it was not truncated: split it"
        )
    way_out = "score it in windows of the model's width with --long-texts window, " if long_texts == "error" else ""
    return Prepared(
        error=f"{length}, over the model's maximum of {max_length}; it was not truncated: {way_out}split it, or use "
        "a model with more positions"
    )


def _word_prefix(text: str, limit: int) -> str | None:
    """The longest run of whole words of `text` within its first `limit` characters, or None when the
    text is no longer than `limit` or those characters hold no word boundary."""
    if len(text) <= limit:
        return None
    words = text[: limit + 1].rsplit(None, 1)  # the character after the limit shows whether a word ends there
    return words[0] if len(words) == 2 else None


def split_characters(text: str) -> str:
    """One character per word ("EVQL" -> "E V Q L"): per-residue models (protein, antibody) read
    space-separated letters, and a sequence written without spaces would otherwise be one unknown token."""
    return " ".join(ch for ch in text if not ch.isspace())


def prepare_encoding(
    encoding: Any, text: str, max_length: int, unk_id: int | None = None, long_texts: str | None = None
) -> Prepared:
    """Turn one tokenizers `Encoding` into the engine's inputs.

    Targets are the non-special tokens; `n_unknown` counts those that are `unk_id`. Each target is
    assigned to the whitespace word in which its character span starts (a piece made only of whitespace
    goes to the following word), so word scores add up to the PLL. With `long_texts` `window`, a text over
    `max_length` is kept (its scorer windows it) up to `WINDOWED_LIMIT` times that (`PLLPreparer`).
    """
    ids = encoding.ids
    if len(ids) > max_length * (WINDOWED_LIMIT if long_texts == "window" else 1):
        return _too_long(f"sentence is {len(ids)} tokens long with special tokens", max_length, long_texts)
    targets = [i for i, special in enumerate(encoding.special_tokens_mask) if not special]
    if not targets:
        return Prepared(error="the tokenizer produced no scorable (non-special) tokens for this text")
    spans = whitespace_words(text)
    ends = [end for _, end in spans]
    last_word = len(spans) - 1
    target_words = [min(bisect_right(ends, encoding.offsets[t][0]), last_word) for t in targets]
    piece_words = [-1 if w is None else w for w in encoding.word_ids]
    return Prepared(
        input_ids=list(ids),
        targets=targets,
        piece_words=piece_words,
        target_words=target_words,
        n_words=len(spans),
        n_unknown=sum(ids[t] == unk_id for t in targets) if unk_id is not None else 0,
    )


class PLLPreparer(Stage):
    """Tokenise a table of read rows (`schema.read_schema`) into `schema.prepared_schema`.

    With `split_chars` the tokenizer sees `split_characters(text)` (the `text` column keeps the input).
    A `partition` column, when present, passes through. `long_texts`: a text over the model's maximum is
    kept whole for a scorer that windows it (`window`, the PLL's: `engine.windows`), or an error row: one
    that names `--long-texts window` (`error`, the PLL's when asked), or not (None: a workload that cannot
    window, such as chain and joints).
    """

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text to tokenise",
        S.STATUS: "ok, or error for a row that could not be read (kept as an error row)",
        S.ERROR: "why the row could not be read",
    }

    def __init__(
        self, tokenizer: Any, max_length: int, split_chars: bool = False, long_texts: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.split_chars = split_chars
        self.long_texts = long_texts
        self.windowed = long_texts == "window"
        self.limit = max_length * (WINDOWED_LIMIT if self.windowed else 1)  # the most tokens a row may have

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return S.prepared_schema(S.PARTITION in columns)

    def process(self, rows: list[Row]) -> list[Row]:
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        prepared: list[Prepared | None] = [None] * len(rows)
        for i, p in zip(ok, self.prepare_texts([rows[i][S.TEXT] for i in ok])):
            prepared[i] = p
        return [_prepared_row(row, p) for row, p in zip(rows, prepared)]

    def prepare_texts(self, texts: list[str]) -> list[Prepared]:
        """Tokenise in one batched call (fast tokenizers parallelise it); blank or over-long texts become
        errors, the over-long ones found on a bounded prefix where one suffices."""
        if self.split_chars:
            texts = [split_characters(t) for t in texts]
        out: list[Prepared | None] = [
            Prepared(error="empty or whitespace-only text") if not t.strip() else None for t in texts
        ]
        for i, error in self._over_long_by_prefix(texts, [i for i, p in enumerate(out) if p is None]).items():
            out[i] = error
        todo = [i for i, p in enumerate(out) if p is None]
        for i, encoding in zip(todo, self._encode([texts[i] for i in todo]) if todo else ()):
            out[i] = prepare_encoding(encoding, texts[i], self.max_length, self.tokenizer.unk_token_id, self.long_texts)
        return out

    def _over_long_by_prefix(self, texts: list[str], candidates: list[int]) -> dict[int, Prepared]:
        """The error of every candidate text whose first whole words alone are over the maximum."""
        limit = self.limit * PROBE_CHARS_PER_TOKEN
        probes = {i: _word_prefix(texts[i], limit) for i in candidates}
        probes = {i: p for i, p in probes.items() if p is not None}
        if not probes:
            return {}
        lengths = [len(ids) for ids in self._encode(list(probes.values()), ids_only=True)]
        return {
            i: _too_long(
                f"sentence is {len(texts[i])} characters long; its first {len(probe)} characters alone make "
                f"{n} tokens with special tokens",
                self.max_length,
                self.long_texts,
            )
            for (i, probe), n in zip(probes.items(), lengths)
            if n > self.limit
        }

    def _encode(self, texts: list[str], ids_only: bool = False) -> list[Any]:
        """The encodings of the texts; with `ids_only`, just their token ids."""
        batch = self.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=False,
            return_special_tokens_mask=not ids_only,
            return_offsets_mapping=not ids_only,
            verbose=False,
        )
        return batch["input_ids"] if ids_only else batch.encodings


def _prepared_row(row: Row, p: Prepared | None) -> Row:
    """The read row with its tokenisation, or with its error (`p` is None for a row that was not read)."""
    error = row[S.ERROR] if p is None else p.error
    p = p or Prepared()
    return {
        **row,
        S.STATUS: S.STATUS_ERROR if error else S.STATUS_OK,
        S.ERROR: error,
        S.INPUT_IDS: p.input_ids,
        S.TARGETS: p.targets,
        S.PIECE_WORDS: p.piece_words,
        S.TARGET_WORDS: p.target_words,
        S.N_WORDS: p.n_words,
        S.N_UNKNOWN: p.n_unknown,
    }
