"""The PLL workload (`dscore score`): pseudo-log-likelihoods of prepared rows (Salazar et al., 2020).

Its prepare stage is `prepare.PLLPreparer` (tokenising on CPU actors); its score stage, `PLLScorer`, loads the
model once per actor (the in-process runner holds one too, so both paths run this code). A row whose
scoring fails on its own becomes an error row; a failure that hits every row (a broken device, say) is
raised so that the caller can retry the whole shard. The engine (torch) is imported by the scorer on
its actor: importing this module on the driver does not import torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import numpy as np
import pyarrow as pa

from ..config import ModelSpec, RowCost, ScoringOptions
from ..engine.masking import Sentence
from ..io import schema as S
from ..measures import pppl
from ..options import ADDED_LATER, by_name
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload

if TYPE_CHECKING:
    from ..engine.masked_lm import MaskedLM
    from ..engine.pll import Conditionals
    from ..engine.windows import Window

logger = logging.getLogger(__name__)

DECLARED = Declaration("pll", engines=("engine.pll",), docs="docs/score.md")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class PLLOptions:
    """What changes a PLL run's rows: the masking variant, the optional columns, per-residue splitting
    and the saved conditionals (added later, so they enter the fingerprint only when set). Batch size is
    not one of them."""

    variant: str
    per_token: bool
    word_scores: bool
    split_chars: bool = field(default=False, metadata=ADDED_LATER)
    conditionals: int = field(default=0, metadata=ADDED_LATER)
    long_texts: str = field(default="error", metadata=ADDED_LATER)  # what every run did before windows

    @classmethod
    def of(cls, scoring: ScoringOptions) -> "PLLOptions":
        """The scoring options' fields that change rows, taken by name."""
        return by_name(cls, scoring)


def to_sentence(row: Row) -> Sentence:
    return Sentence(
        input_ids=np.asarray(row[S.INPUT_IDS], dtype=np.int64),
        targets=np.asarray(row[S.TARGETS], dtype=np.int64),
        piece_words=np.asarray(row[S.PIECE_WORDS], dtype=np.int64),
    )


class PLLScorer(Stage):
    """Adds PLL, counts and PPPLs (and optionally per-token and word scores) to prepared rows."""

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text, kept",
        S.STATUS: "ok, or error for a row that could not be read or tokenised (kept as an error row)",
        S.ERROR: "why the row could not be read or tokenised",
        S.INPUT_IDS: "the model's token ids, special tokens included",
        S.TARGETS: "the positions of input_ids to mask and score",
        S.PIECE_WORDS: "the tokenizer's word of each token (word_l2r masks a word's pieces together)",
        S.TARGET_WORDS: "the whitespace word of each target (word scores)",
        S.N_WORDS: "the number of whitespace words (PPPL per word)",
        S.N_UNKNOWN: "the number of targets that are the unknown token",
    }

    def __init__(self, model: ModelSpec, options: ScoringOptions, mlm: MaskedLM | None = None) -> None:
        from ..engine.masked_lm import load_masked_lm
        from ..engine.pll import PLLEngine

        self.mlm = mlm or load_masked_lm(model)
        self.model_name = model.name
        self.options = options
        self.engine = PLLEngine(self.mlm, options.variant, options.batch_tokens)
        self.signature = self.mlm.signature

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return S.output_schema(
            self.options.per_token,
            self.options.word_scores,
            S.PARTITION in columns,
            self.options.conditionals > 0,
            windowed=self.windows,
        )

    @property
    def windows(self) -> bool:
        """Whether texts longer than the model's window are scored in windows (their rows say `windowed`)."""
        return self.options.long_texts == "window"

    def process(self, rows: list[Row]) -> list[Row]:
        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        scored: list[np.ndarray | Conditionals | str | None] = [None] * len(rows)
        for i, result in zip(ok, self._score([to_sentence(rows[i]) for i in ok])):
            scored[i] = result
        return [self._row(row, result) for row, result in zip(rows, scored)]

    def _score(self, sentences: Sequence[Sentence]) -> list[np.ndarray | Conditionals | str]:
        """Token log-probs (with --conditionals, and the conditionals) per sentence, or an error message for
        a sentence that fails on its own. A sentence longer than the model's window (the preparer lets one
        through with `--long-texts window`) is scored as its windows, batched with the others, and stitched."""
        from ..engine.windows import split, stitch

        k = self.options.conditionals
        parts: list[list[Window] | str | None] = [
            split(s, self.mlm.max_length, self.options.variant) if len(s.input_ids) > self.mlm.max_length else None
            for s in sentences
        ]
        flat = [w.sentence for p in parts if isinstance(p, list) for w in p]
        flat += [s for s, p in zip(sentences, parts) if p is None]
        if k:
            results = isolated(lambda batch: self.engine.token_conditionals(batch, k, self.report), flat)
        else:
            results = isolated(lambda batch: self.engine.token_logprobs(batch, self.report), flat)
        windowed, whole = iter(results[: len(flat) - parts.count(None)]), iter(results[len(flat) - parts.count(None) :])
        out: list[np.ndarray | Conditionals | str] = []
        for s, p in zip(sentences, parts):
            if p is None:
                out.append(next(whole))
            elif isinstance(p, str):
                out.append(p)
            else:
                got = [next(windowed) for _ in p]
                failed = next((g for g in got if isinstance(g, str)), None)
                out.append(failed if failed is not None else stitch(len(s.targets), p, got))
        return out

    def _row(self, row: Row, scored: np.ndarray | Conditionals | str | None) -> Row:
        """The output row of a prepared row and its token log-probs (or error); `partition` passes through."""
        conditionals = None if scored is None or isinstance(scored, (str, np.ndarray)) else scored
        result = conditionals.logprobs if conditionals is not None else scored
        error = result if isinstance(result, str) else row[S.ERROR]
        ok = error is None and result is not None
        logprobs = result if ok else None
        n_tokens = len(logprobs) if ok else 0
        n_words = row[S.N_WORDS] if ok else 0
        pll = float(logprobs.sum()) if ok else None
        out = {
            **row,
            S.PLL: pll,
            S.N_TOKENS: n_tokens,
            S.N_WORDS: n_words,
            S.N_UNKNOWN: row[S.N_UNKNOWN] if ok else 0,
            S.PPPL_TOKEN: pppl(pll, n_tokens) if ok else None,
            S.PPPL_WORD: pppl(pll, n_words) if ok else None,
            S.STATUS: S.STATUS_OK if ok else S.STATUS_ERROR,
            S.ERROR: None if ok else error,
            S.MODEL: self.model_name,
            S.VARIANT: self.options.variant,
        }
        out[S.WINDOWED] = ok and len(row[S.INPUT_IDS]) > self.mlm.max_length  # a column with --long-texts window
        if self.options.per_token:
            ids = [row[S.INPUT_IDS][t] for t in row[S.TARGETS]] if ok else None
            out[S.TOKENS] = self.mlm.tokenizer.convert_ids_to_tokens(ids) if ok else None
            out[S.TOKEN_LOGPROBS] = logprobs.tolist() if ok else None
        if self.options.word_scores:
            words = np.bincount(row[S.TARGET_WORDS], weights=logprobs, minlength=n_words) if ok else None
            out[S.WORD_SCORES] = words.tolist() if ok else None
        if self.options.conditionals:
            out[S.COND_IDS] = conditionals.ids.tolist() if ok else None
            out[S.COND_LOGPROBS] = conditionals.top.tolist() if ok else None
            out[S.COND_REST] = conditionals.rest.tolist() if ok else None
        return out


def isolated(score: Callable[[Sequence[T]], Sequence[R]], items: Sequence[T]) -> list[R | str]:
    """score(items), or, when that fails, each item scored alone: an item that fails on its own gets an
    error message in its place; a failure that hits every item is raised (the caller retries the shard)."""
    try:
        return list(score(items))
    except Exception as exc:  # noqa: BLE001 - isolated below, re-raised when not row-specific
        if len(items) < 2:
            if not items:
                raise
            return [f"scoring failed: {type(exc).__name__}: {exc}"]
        logger.warning("a batch failed (%s); scoring its %d rows one by one", exc, len(items))
        results: list[R | str] = []
        for item in items:
            try:
                results.append(score([item])[0])
            except Exception as row_exc:  # noqa: BLE001 - becomes this row's error
                results.append(f"scoring failed: {type(row_exc).__name__}: {row_exc}")
        if all(isinstance(r, str) for r in results):
            raise
        return results


def pll_preparer(model: ModelSpec, split_chars: bool, long_texts: str | None = None) -> Callable[[pa.Table], pa.Table]:
    from ..engine.model_files import load_tokenizer
    from .prepare import PLLPreparer

    tokenizer, max_length = load_tokenizer(model)
    return PLLPreparer(tokenizer, max_length, split_chars, long_texts)


def row_cost(model: ModelSpec, passes_per_token: float, passes_per_row: float = 0.0) -> RowCost | None:
    """What scoring a row of the rows `pll_preparer` makes costs, by which default shards are cut
    (`pipeline.sizing`, which measures the input's bytes per token): `passes_per_token` forward passes a
    token (the PLL's one masked copy each) and `passes_per_row` more. None when the model's configuration
    does not give its sizes: shards by rows."""
    from ..engine.model_files import position_flops

    flops = position_flops(model)
    return None if flops is None else RowCost(flops, passes_per_token, passes_per_row)


def pll_workload(model: ModelSpec, scoring: ScoringOptions, cost: RowCost | None = None) -> Workload:
    """Masked-LM pseudo-log-likelihoods (`dscore score`); `cost`: a row's (`row_cost`, a pass a token)."""
    return DECLARED.workload(
        PLLOptions.of(scoring),
        partial(pll_preparer, model, scoring.split_chars, scoring.long_texts),
        partial(PLLScorer, model, scoring),
        model.device,
        row_cost=cost,
    )
