"""The maskless workload (`dscore score --maskless DIR`): each sentence's PLL predicted by a maskless
student (`dscore train maskless`) in one forward pass, written in the PLL's row schema.

The rows are the PLL rows (`schema.output_schema`) with `pll` the student's prediction and `variant`
`maskless`, so the summary, PPPLs and everything that reads PLL rows work unchanged; `n_tokens` is the
number of tokens the teacher would have scored. The prepare stage is the PLL's own tokenising stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec, ScoringOptions
from ..io import schema as S
from ..measures import pppl
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Workload
from .pll import isolated, pll_preparer

VARIANT = "maskless"


@dataclass(frozen=True)
class MasklessOptions:
    """What changes a maskless run's rows besides the student folder (the run's model): per-residue
    splitting. Batch size is not one of them."""

    split_chars: bool


class MasklessScorer(Stage):
    """Adds the predicted PLL, counts and PPPLs to prepared rows; rows that could not be tokenised stay
    error rows, as does a row whose forward pass fails on its own (`pll.isolated`)."""

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text, kept",
        S.STATUS: "ok, or error for a row that could not be read or tokenised (kept as an error row)",
        S.ERROR: "why the row could not be read or tokenised",
        S.INPUT_IDS: "the model's token ids, special tokens included: the student's one input",
        S.TARGETS: "the tokens a PLL would score (their number is n_tokens)",
        S.N_WORDS: "the number of whitespace words (PPPL per word)",
        S.N_UNKNOWN: "the number of targets that are the unknown token",
    }

    def __init__(self, model: ModelSpec, batch_tokens: int | None) -> None:
        from ..engine.maskless import MasklessEngine, load_student

        self.engine = MasklessEngine(load_student(model), batch_tokens)
        self.signature = self.engine.student.signature
        self.model_name = model.name

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return S.output_schema(partition=S.PARTITION in columns)

    def process(self, rows: list[Row]) -> list[Row]:
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        predicted: list[float | str | None] = [None] * len(rows)
        sequences = [np.asarray(rows[i][S.INPUT_IDS], dtype=np.int64) for i in ok]
        for i, result in zip(ok, isolated(lambda s: self.engine.predict(s).tolist(), sequences) if ok else []):
            predicted[i] = result
        return [self._row(row, result) for row, result in zip(rows, predicted)]

    def _row(self, row: Row, result: float | str | None) -> Row:
        """The output row of a prepared row and its predicted PLL (or its error)."""
        ok = isinstance(result, float)
        pll = result if ok else None
        n_tokens = len(row[S.TARGETS]) if ok else 0
        n_words = row[S.N_WORDS] if ok else 0
        return {
            **row, S.PLL: pll, S.N_TOKENS: n_tokens, S.N_WORDS: n_words, S.N_UNKNOWN: row[S.N_UNKNOWN] if ok else 0,
            S.PPPL_TOKEN: pppl(pll, n_tokens) if ok else None, S.PPPL_WORD: pppl(pll, n_words) if ok else None,
            S.STATUS: S.STATUS_OK if ok else S.STATUS_ERROR, S.ERROR: None if ok else (result or row[S.ERROR]),
            S.MODEL: self.model_name, S.VARIANT: VARIANT,
        }


def maskless_workload(student: ModelSpec, scoring: ScoringOptions) -> Workload:
    """Predicted PLLs from a maskless student folder (`dscore score --maskless`)."""
    return Workload("maskless", MasklessOptions(scoring.split_chars), partial(pll_preparer, student, scoring.split_chars),
                    partial(MasklessScorer, student, scoring.batch_tokens), student.device)
