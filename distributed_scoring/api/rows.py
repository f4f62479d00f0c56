"""The rows `MLMScorer` takes and gives: a list of texts as the read rows the workloads' stages take (as the
readers make them from files), and the stages' rows as the API returns them, without the columns that are
the run's rather than the text's."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from ..errors import UserError
from ..io import schema as S
from ..io.sources import ok_row, without_lone_surrogates
from ..pipeline.stage import Row

# Columns of the scored rows that the API leaves out: the row's id is its place in the input list, and
# the model and variant are the scorer's own (`MLMScorer.signature`).
INTERNAL = (S.ID, S.MODEL, S.VARIANT)


def added_schema(per_token: bool = False, word_scores: bool = False, prefix: str = "") -> pa.Schema:
    """The columns scoring adds to a table of texts: `dscore score`'s output columns but the id, the
    text, the model and the variant, each name prefixed with `prefix`."""
    fields = S.output_schema(per_token, word_scores, windowed=True)
    return pa.schema([f.with_name(prefix + f.name) for f in fields if f.name not in (*INTERNAL, S.TEXT)])


def read_rows(
    texts: Sequence[object],
    ids: Sequence[object] | None = None,
    answers: Sequence[object] | None = None,
    answer_column: str = "answer",
) -> list[Row]:
    """The read rows (id, text, status, error) of a list of texts, as the readers make them from files:
    a missing or non-string text, or one holding a lone surrogate, is an error row. Ids are the texts'
    places in the list unless given; `answers` (a string of space-separated tokens or a list of tokens,
    or None) go into `answer_column`."""
    if isinstance(texts, (str, bytes)):
        raise UserError("expected a list of texts and got a single string: wrap it in a list, [text]")
    texts = list(texts)
    names = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
    if len(names) != len(texts) or len(set(names)) != len(names):
        raise UserError(
            f"ids must be {len(texts)} distinct values, one per text; got {len(names)} ({len(set(names))} distinct)"
        )
    rows = [without_lone_surrogates(ok_row(name, text), name) for name, text in zip(names, texts)]
    if answers is not None:
        answers = list(answers)
        if len(answers) != len(texts):
            raise UserError(f"answers must be one per text: got {len(answers)} for {len(texts)} texts")
        for row, answer in zip(rows, answers):
            row[answer_column] = " ".join(answer) if isinstance(answer, (list, tuple)) else answer
    return rows


def public(row: Row, names: Sequence[str]) -> dict:
    """A stage's output row as the API returns it: the columns `names`, without the internal ones."""
    return {name: row[name] for name in names if name not in INTERNAL}
