"""The prepare stage: tokenise read rows into the columns the PLL engine needs.

It needs the tokenizer only, never the model, so the Ray pipeline runs it on CPU tasks beside the
scoring actors. Rows that cannot be scored (empty, too long, nothing to score) leave as error rows;
nothing is truncated.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from . import schema as S

_WORD = re.compile(r"\S+")


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


def split_characters(text: str) -> str:
    """One character per word ("EVQL" -> "E V Q L"): per-residue models (protein, antibody) read
    space-separated letters, and a sequence written without spaces would otherwise be one unknown token."""
    return " ".join(ch for ch in text if not ch.isspace())


def prepare_encoding(encoding: Any, text: str, max_length: int, unk_id: int | None = None) -> Prepared:
    """Turn one tokenizers `Encoding` into the engine's inputs.

    Targets are the non-special tokens; `n_unknown` counts those that are `unk_id`. Each target is
    assigned to the whitespace word in which its character span starts (a piece made only of whitespace
    goes to the following word), so word scores add up to the PLL.
    """
    ids = encoding.ids
    if len(ids) > max_length:
        return Prepared(
            error=f"sentence is {len(ids)} tokens long with special tokens, over the model's maximum of "
            f"{max_length}; it was not truncated: split it, or use a model with more positions"
        )
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


class Preparer:
    """Tokenise a table of read rows (`schema.read_schema`) into `schema.prepared_schema`.

    With `split_chars` the tokenizer sees `split_characters(text)` (the `text` column keeps the input).
    """

    def __init__(self, tokenizer: Any, max_length: int, split_chars: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.split_chars = split_chars

    def prepare_texts(self, texts: list[str]) -> list[Prepared]:
        """Tokenise in one batched call (fast tokenizers parallelise it); blank texts become errors."""
        if self.split_chars:
            texts = [split_characters(t) for t in texts]
        blank = [not t.strip() for t in texts]
        todo = [t for t, b in zip(texts, blank) if not b]
        encodings = iter(self._encode(todo)) if todo else iter(())
        out = []
        for text, is_blank in zip(texts, blank):
            if is_blank:
                out.append(Prepared(error="empty or whitespace-only text"))
            else:
                out.append(prepare_encoding(next(encodings), text, self.max_length, self.tokenizer.unk_token_id))
        return out

    def _encode(self, texts: list[str]) -> list[Any]:
        batch = self.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=False,
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
            verbose=False,
        )
        return batch.encodings

    def __call__(self, table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        prepared: list[Prepared | None] = [None] * len(rows)
        for i, p in zip(ok, self.prepare_texts([rows[i][S.TEXT] for i in ok])):
            prepared[i] = p
        schema = S.prepared_schema(S.PARTITION in table.column_names)
        columns: dict[str, list] = {name: [] for name in schema.names}
        for row, p in zip(rows, prepared):
            error = row[S.ERROR] if p is None else p.error
            p = p or Prepared()
            columns[S.ID].append(row[S.ID])
            columns[S.TEXT].append(row[S.TEXT])
            columns[S.STATUS].append(S.STATUS_ERROR if error else S.STATUS_OK)
            columns[S.ERROR].append(error)
            columns[S.INPUT_IDS].append(p.input_ids)
            columns[S.TARGETS].append(p.targets)
            columns[S.PIECE_WORDS].append(p.piece_words)
            columns[S.TARGET_WORDS].append(p.target_words)
            columns[S.N_WORDS].append(p.n_words)
            columns[S.N_UNKNOWN].append(p.n_unknown)
            if S.PARTITION in columns:
                columns[S.PARTITION].append(row[S.PARTITION])
        return pa.Table.from_pydict(columns, schema=schema)
