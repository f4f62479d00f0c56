"""The prepare stage of texts with mask tokens (infill, generate, sample), written once.

Each of those workloads reads a text whose mask tokens (or, for `sample --free-all`, every ordinary
token) mark the positions it works on. The stage tokenises with character offsets (tokenizer only),
refuses texts longer than the model, and writes the token ids, the positions and their character spans
(so that a filled token can be written back into the text as it reads). What positions a row works on,
and what else makes it unusable, is each workload's own (`locate`); a row that cannot be used becomes an
error row, its columns null.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Sequence

from ..config import ModelSpec
from ..io import schema as S
from ..pipeline.stage import Row, Stage

SPANS = "spans"  # each position's (start, end) characters in the text


class MaskedPreparer(Stage):
    """Subclasses set `writes` (their prepared schema: `input_ids`, `positions`, `spans` and their own
    columns) and `positions` (the column of the positions), and implement `locate`."""

    reads = {
        S.ID: "the row's id",
        S.TEXT: "the text with mask tokens",
        S.STATUS: "ok, or error if unreadable",
        S.ERROR: "why the row could not be read",
    }
    positions: ClassVar[str]

    def __init__(self, model: ModelSpec, options: Any) -> None:
        from ..engine.model_files import load_tokenizer

        self.tokenizer, self.max_length = load_tokenizer(model)
        self.options = options

    def process(self, rows: list[Row]) -> list[Row]:
        return [self._row(row) for row in rows]

    def carried(self, row: Row) -> Row:
        """Input columns the prepared row carries (an answer), on error rows too."""
        return {}

    def refuse(self, text: str) -> str | None:
        """Why a text cannot be used, told before it is tokenised; None to go on."""
        return None

    @abstractmethod
    def locate(self, row: Row, ids: list[int], offsets: Sequence[tuple[int, int]]) -> Row | str:
        """The row's positions (`{self.positions: [...]}`, with the workload's own columns), or why it
        cannot be used."""

    def masks(self, ids: list[int]) -> list[int]:
        """The positions of the mask tokens."""
        return [i for i, token in enumerate(ids) if token == self.tokenizer.mask_token_id]

    def _row(self, row: Row) -> Row:
        out = {
            **dict.fromkeys(self.writes.names),
            **S.key(row),
            S.TEXT: row[S.TEXT],
            **self.carried(row),
            S.STATUS: row[S.STATUS],
            S.ERROR: row[S.ERROR],
        }
        if row[S.STATUS] != S.STATUS_OK:
            return out
        prepared = self._prepare(row)
        if isinstance(prepared, str):
            return {**out, S.STATUS: S.STATUS_ERROR, S.ERROR: prepared}
        return {**out, **prepared}

    def _prepare(self, row: Row) -> Row | str:
        text = row[S.TEXT]
        refused = self.refuse(text)
        if refused:
            return refused
        encoding = self.tokenizer(text, return_offsets_mapping=True, truncation=False)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        if len(ids) > self.max_length:
            return f"text is {len(ids)} tokens long, over the model's maximum of {self.max_length}"
        located = self.locate(row, ids, offsets)
        if isinstance(located, str):
            return located
        return {S.INPUT_IDS: ids, SPANS: [list(offsets[i]) for i in located[self.positions]], **located}


def unanswerable(answer: str | None, positions: int, what: str) -> str | None:
    """Why an answer (tokens separated by spaces) does not fit `positions` positions, or None."""
    if answer is not None and len(answer.split()) != positions:
        return f"the answer has {len(answer.split())} tokens for {positions} {what}"
    return None
