"""The maskless workloads: each sentence's PLL in one forward pass of the unmasked sentence, written in the
PLL's row schema.

- `maskless` (`dscore score --maskless DIR`): predicted by a student (`dscore train maskless`), through
  the calibration its folder records (an affine map per token, fitted on its held-out rows); the rows
  add `out_of_range`, true where the predicted PLL per token lies outside the range the teacher's
  training rows spanned (the student extrapolates there).
- `unmasked` (`dscore score --method unmasked`): the masked LM itself read unmasked, sum over the scored
  tokens of log p(w_t | W) (Salazar et al., 2020, Table 6, "no masking"); no training.

`pll` holds the score and `variant` says `maskless` or `unmasked`, so the summary, PPPLs and everything
that reads PLL rows work unchanged; `n_tokens` is the number of tokens the teacher would have scored. With
`per_token` (per-token scorers: `unmasked`, `token` and `distribution` students) `tokens` and
`token_logprobs` hold each scored token's predicted term. The prepare stage is the PLL's own tokenising stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec, RowCost, ScoringOptions
from ..io import schema as S
from ..measures import pppl
from ..options import ADDED_LATER
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .pll import isolated, pll_preparer, to_sentence

if TYPE_CHECKING:
    from ..engine.maskless import Prediction

MASKLESS, UNMASKED = "maskless", "unmasked"  # the workloads' names, and their rows' `variant`
DECLARED = Declaration(MASKLESS, engines=("engine.maskless",), docs="docs/score.md")  # UNMASKED is its other name
RANGE = "range"  # maskless.json: the training rows' span, {"pll_per_token": [lowest, highest]}


@dataclass(frozen=True)
class MasklessOptions:
    """What changes a maskless or unmasked run's rows besides the model or student folder: per-residue
    splitting and the per-token columns. Batch size is not one of them."""

    split_chars: bool
    per_token: bool = field(default=False, metadata=ADDED_LATER)


def out_of_range(pll: float, n_tokens: int, span: Sequence[float] | None) -> bool | None:
    """Whether a predicted PLL per token lies outside the training rows' [lowest, highest]; None when the
    student records no span."""
    if span is None:
        return None
    per_token = pll / n_tokens
    return bool(per_token < span[0] or per_token > span[1])


class MasklessScorer(Stage):
    """Adds the predicted PLL, counts and PPPLs (and optionally the per-token terms) to prepared rows; rows
    that could not be tokenised stay error rows, as does a row whose forward pass fails on its own
    (`pll.isolated`)."""

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text, kept",
        S.STATUS: "ok, or error for a row that could not be read or tokenised (kept as an error row)",
        S.ERROR: "why the row could not be read or tokenised",
        S.INPUT_IDS: "the model's token ids, special tokens included: the one input",
        S.TARGETS: "the tokens a PLL would score (their number is n_tokens; per-token scorers predict each)",
        S.PIECE_WORDS: "the tokenizer's word of each token (carried into the engine's sentence)",
        S.N_WORDS: "the number of whitespace words (PPPL per word)",
        S.N_UNKNOWN: "the number of targets that are the unknown token",
    }

    def __init__(self, model: ModelSpec, batch_tokens: int | None, per_token: bool, method: str) -> None:
        from ..engine.maskless import MasklessEngine, load_student, unmasked_scorer

        student = unmasked_scorer(model) if method == UNMASKED else load_student(model)
        self.engine = MasklessEngine(student, batch_tokens)
        self.signature = student.signature
        self.model_name = model.name
        self.per_token = per_token
        self.method = method
        self.span = student.info.get(RANGE, {}).get("pll_per_token") if method == MASKLESS else None

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return S.output_schema(self.per_token, partition=S.PARTITION in columns, out_of_range=self.method == MASKLESS)

    def process(self, rows: list[Row]) -> list[Row]:
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        predicted: list[Prediction | str | None] = [None] * len(rows)
        sentences = [to_sentence(rows[i]) for i in ok]
        for i, result in zip(ok, isolated(self.engine.predict, sentences) if ok else []):
            predicted[i] = result
        return [self._row(row, result) for row, result in zip(rows, predicted)]

    def _row(self, row: Row, result: Prediction | str | None) -> Row:
        """The output row of a prepared row and its prediction (or its error)."""
        ok = result is not None and not isinstance(result, str)
        pll = result.pll if ok else None
        n_tokens = len(row[S.TARGETS]) if ok else 0
        n_words = row[S.N_WORDS] if ok else 0
        out = {
            **row,
            S.PLL: pll,
            S.N_TOKENS: n_tokens,
            S.N_WORDS: n_words,
            S.N_UNKNOWN: row[S.N_UNKNOWN] if ok else 0,
            S.PPPL_TOKEN: pppl(pll, n_tokens) if ok else None,
            S.PPPL_WORD: pppl(pll, n_words) if ok else None,
            S.STATUS: S.STATUS_OK if ok else S.STATUS_ERROR,
            S.ERROR: None if ok else (result or row[S.ERROR]),
            S.MODEL: self.model_name,
            S.VARIANT: self.method,
        }
        if self.method == MASKLESS:
            out[S.OUT_OF_RANGE] = out_of_range(pll, n_tokens, self.span) if ok else None
        if self.per_token:
            ids = [row[S.INPUT_IDS][t] for t in row[S.TARGETS]] if ok else None
            out[S.TOKENS] = self.engine.student.mlm.tokenizer.convert_ids_to_tokens(ids) if ok else None
            out[S.TOKEN_LOGPROBS] = np.asarray(result.token_logprobs).tolist() if ok else None
        return out


def maskless_workload(
    model: ModelSpec, scoring: ScoringOptions, method: str = MASKLESS, cost: RowCost | None = None
) -> Workload:
    """Predicted PLLs from a student folder (`dscore score --maskless`), or with `method` UNMASKED the
    masked LM's one-pass scores (`dscore score --method unmasked`); `cost`: a row's (`pll.row_cost`, one
    pass a row)."""
    return DECLARED.workload(
        MasklessOptions(scoring.split_chars, scoring.per_token),
        partial(pll_preparer, model, scoring.split_chars),
        partial(MasklessScorer, model, scoring.batch_tokens, scoring.per_token, method),
        model.device,
        name=method,
        row_cost=cost,
    )
