"""What runs on each shard: a workload's prepare and score stages, built once per worker.

Both executions (in-process in `runner.py`, Ray actors in `pipeline.py`) take a `Workload`, so a new
kind of scoring (PLL, causal-LM log-probabilities, pairwise joints) brings its name, its options
dataclass and its two stage factories, and reuses reading, sharding, writing, resume and fault
tolerance unchanged: the run's fingerprint comes from the name and options (`output.fingerprint`).
Factories must be picklable (module-level functions and `functools.partial` of them), since Ray ships
them to its workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Protocol

import pyarrow as pa

from .config import ModelSpec, ScoringOptions
from .output import ADDED_LATER


class ShardScorer(Protocol):
    """A score stage: prepared rows in, output rows out, and the signature its markers record."""

    signature: dict

    def __call__(self, prepared: pa.Table) -> pa.Table: ...


@dataclass(frozen=True)
class Workload:
    """`name` and `options` (a frozen dataclass of what changes the results, every field) make the run's
    fingerprint; `device` sizes the Ray actors (see pipeline.plan_resources); `rows_per_input` is how
    many output rows each input row becomes (the no-loss check counts them)."""

    name: str
    options: Any
    make_preparer: Callable[[], Callable[[pa.Table], pa.Table]]
    make_scorer: Callable[[], ShardScorer]
    device: str
    rows_per_input: int = 1


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


@dataclass(frozen=True)
class CausalOptions:
    """A causal LM's log P(W) has no option yet: the model and its boundary tokens settle it."""


def _pll_preparer(model: ModelSpec, split_chars: bool) -> Callable[[pa.Table], pa.Table]:
    from .model_files import load_tokenizer
    from .prepare import Preparer

    tokenizer, max_length = load_tokenizer(model)
    return Preparer(tokenizer, max_length, split_chars)


def _pll_scorer(model: ModelSpec, scoring: ScoringOptions) -> Any:
    from .scorer import Scorer

    return Scorer(model, scoring)


def pll_workload(model: ModelSpec, scoring: ScoringOptions) -> Workload:
    """Masked-LM pseudo-log-likelihoods (`dscore score`)."""
    return Workload("pll", PLLOptions.of(scoring), partial(_pll_preparer, model, scoring.split_chars),
                    partial(_pll_scorer, model, scoring), model.device)


def _unchanged() -> Callable[[pa.Table], pa.Table]:
    return _identity


def _identity(table: pa.Table) -> pa.Table:
    return table


def _causal_scorer(model: ModelSpec, batch_tokens: int | None) -> Any:
    from .causal import CausalScorer

    return CausalScorer(model, batch_tokens)


def causal_workload(model: ModelSpec, batch_tokens: int | None = None) -> Workload:
    """Causal-LM log P(W) with the model's BOS/EOS around each sentence (N-best rescoring).

    Its tokenisation depends on the loaded LM's boundary tokens, so it runs in the score stage.
    """
    return Workload("causal", CausalOptions(), _unchanged, partial(_causal_scorer, model, batch_tokens), model.device)
