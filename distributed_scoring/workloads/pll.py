"""The PLL workload (`dscore score`): pseudo-log-likelihoods of prepared rows (Salazar et al., 2020).

Its prepare stage is `prepare.Preparer` (tokenising on CPU actors); its score stage, `Scorer`, loads the
model once per actor (the in-process runner holds one too, so both paths run this code). A row whose
scoring fails on its own becomes an error row; a failure that hits every row (a broken device, say) is
raised so that the caller can retry the whole shard. The engine (torch) is imported by the scorer on
its actor: importing this module on the driver does not import torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa

from ..io import schema as S
from ..config import ModelSpec, ScoringOptions
from ..engine.masking import Sentence
from ..measures import pppl
from ..io.output import ADDED_LATER
from ..pipeline.workload import Workload

if TYPE_CHECKING:
    from ..engine.models import MaskedLM

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PLLOptions:
    """What changes a PLL run's rows: the masking variant, the optional columns, per-residue splitting
    (added later, so it enters the fingerprint only when set). Batch size is not one of them."""

    variant: str
    per_token: bool
    word_scores: bool
    split_chars: bool = field(default=False, metadata=ADDED_LATER)

    @classmethod
    def of(cls, scoring: ScoringOptions) -> "PLLOptions":
        return cls(scoring.variant, scoring.per_token, scoring.word_scores, scoring.split_chars)


def to_sentence(row: dict) -> Sentence:
    return Sentence(
        input_ids=np.asarray(row[S.INPUT_IDS], dtype=np.int64),
        targets=np.asarray(row[S.TARGETS], dtype=np.int64),
        piece_words=np.asarray(row[S.PIECE_WORDS], dtype=np.int64),
    )


class Scorer:
    """Adds PLL, counts and PPPLs (and optionally per-token and word scores) to prepared rows."""

    def __init__(self, model: ModelSpec, options: ScoringOptions, mlm: MaskedLM | None = None) -> None:
        from ..engine.models import load_masked_lm
        from ..engine.pll import PLLEngine

        self.mlm = mlm or load_masked_lm(model)
        self.model_name = model.name
        self.options = options
        self.engine = PLLEngine(self.mlm, options.variant, options.batch_tokens)
        self.signature = self.mlm.signature

    def __call__(self, prepared: pa.Table) -> pa.Table:
        rows = prepared.to_pylist()
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        results = self._score([to_sentence(rows[i]) for i in ok])
        scored: list[np.ndarray | str | None] = [None] * len(rows)
        for i, result in zip(ok, results):
            scored[i] = result
        schema = S.output_schema(self.options.per_token, self.options.word_scores, S.PARTITION in prepared.column_names)
        columns: dict[str, list] = {name: [] for name in schema.names}
        for row, result in zip(rows, scored):
            self._append(columns, row, result)
        return pa.Table.from_pydict(columns, schema=schema)

    def _score(self, sentences: Sequence[Sentence]) -> list[np.ndarray | str]:
        """Token log-probs per sentence, or an error message for a sentence that fails on its own."""
        try:
            return list(self.engine.token_logprobs(sentences))
        except Exception as exc:  # noqa: BLE001 - isolated below, re-raised when not row-specific
            if len(sentences) < 2:
                if not sentences:
                    raise
                return [f"scoring failed: {type(exc).__name__}: {exc}"]
            logger.warning("a batch failed (%s); scoring its %d sentences one by one", exc, len(sentences))
            results: list[np.ndarray | str] = []
            for sentence in sentences:
                try:
                    results.append(self.engine.token_logprobs([sentence])[0])
                except Exception as row_exc:  # noqa: BLE001 - becomes this row's error
                    results.append(f"scoring failed: {type(row_exc).__name__}: {row_exc}")
            if all(isinstance(r, str) for r in results):
                raise
            return results

    def _append(self, columns: dict[str, list], row: dict, result: np.ndarray | str | None) -> None:
        error = result if isinstance(result, str) else row[S.ERROR]
        ok = error is None and result is not None
        logprobs = result if ok else None
        n_tokens = len(logprobs) if ok else 0
        n_words = row[S.N_WORDS] if ok else 0
        pll = float(logprobs.sum()) if ok else None
        columns[S.ID].append(row[S.ID])
        columns[S.TEXT].append(row[S.TEXT])
        columns[S.PLL].append(pll)
        columns[S.N_TOKENS].append(n_tokens)
        columns[S.N_WORDS].append(n_words)
        columns[S.N_UNKNOWN].append(row[S.N_UNKNOWN] if ok else 0)
        columns[S.PPPL_TOKEN].append(pppl(pll, n_tokens) if ok else None)
        columns[S.PPPL_WORD].append(pppl(pll, n_words) if ok else None)
        columns[S.STATUS].append(S.STATUS_OK if ok else S.STATUS_ERROR)
        columns[S.ERROR].append(None if ok else error)
        columns[S.MODEL].append(self.model_name)
        columns[S.VARIANT].append(self.options.variant)
        if self.options.per_token:
            ids = [row[S.INPUT_IDS][t] for t in row[S.TARGETS]] if ok else None
            columns[S.TOKENS].append(self.mlm.tokenizer.convert_ids_to_tokens(ids) if ok else None)
            columns[S.TOKEN_LOGPROBS].append(logprobs.tolist() if ok else None)
        if self.options.word_scores:
            words = np.bincount(row[S.TARGET_WORDS], weights=logprobs, minlength=n_words) if ok else None
            columns[S.WORD_SCORES].append(words.tolist() if ok else None)
        if S.PARTITION in columns:
            columns[S.PARTITION].append(row[S.PARTITION])


def _pll_preparer(model: ModelSpec, split_chars: bool) -> Callable[[pa.Table], pa.Table]:
    from ..engine.model_files import load_tokenizer
    from .prepare import Preparer

    tokenizer, max_length = load_tokenizer(model)
    return Preparer(tokenizer, max_length, split_chars)


def pll_workload(model: ModelSpec, scoring: ScoringOptions) -> Workload:
    """Masked-LM pseudo-log-likelihoods (`dscore score`)."""
    return Workload("pll", PLLOptions.of(scoring), partial(_pll_preparer, model, scoring.split_chars),
                    partial(Scorer, model, scoring), model.device)
