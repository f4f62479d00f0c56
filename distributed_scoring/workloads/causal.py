"""The causal-LM workload of N-best rescoring: log P(W) of each text with the model's BOS/EOS around it.

Its tokenisation depends on the loaded LM's boundary tokens (see `causal`), so it runs in the score
stage; the prepare stage passes rows through.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa

from ..config import ModelSpec
from ..io import schema as S
from ..io.schema import LOGP
from ..pipeline.progress import Report, ignore
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload

if TYPE_CHECKING:  # the engine (torch) is imported on the scoring actor, never on the driver
    from ..engine.causal import CausalEngine

CAUSAL_SCHEMA = pa.schema(
    [
        pa.field(S.TEXT, pa.string(), nullable=False),
        pa.field(LOGP, pa.float64()),
        pa.field(S.N_TOKENS, pa.int32(), nullable=False),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
    ]
)

DECLARED = Declaration("causal", engines=("engine.causal",), docs="docs/rescore.md")  # rescore's --causal-model


@dataclass(frozen=True)
class CausalOptions:
    """A causal LM's log P(W) has no option yet: the model and its boundary tokens settle it."""


def score_texts(engine: CausalEngine, texts: Sequence[str]) -> pa.Table:
    """One `CAUSAL_SCHEMA` row per text: log P(W) and |W|, or an error row (blank, too long)."""
    return pa.Table.from_pylist(_scored_rows(engine, texts), schema=CAUSAL_SCHEMA)


def _scored_rows(engine: CausalEngine, texts: Sequence[str], report: Report = ignore) -> list[Row]:
    from ..engine.causal import encode

    encoded = encode(engine.lm, texts)
    ok = [i for i, e in enumerate(encoded) if not isinstance(e, str)]
    logprobs = dict(zip(ok, engine.token_logprobs([encoded[i] for i in ok], report)))
    tail = 0 if engine.lm.eos_id is None else 1
    return [
        {
            S.TEXT: text,
            LOGP: float(logprobs[i].sum()),
            S.N_TOKENS: len(e) - 1 - tail,
            S.STATUS: S.STATUS_OK,
            S.ERROR: None,
        }
        if i in logprobs
        else {S.TEXT: text, LOGP: None, S.N_TOKENS: 0, S.STATUS: S.STATUS_ERROR, S.ERROR: e}
        for i, (text, e) in enumerate(zip(texts, encoded))
    ]


# `id` and `model` are nullable in the files this workload has always written; declaring them not null
# would change every file's bytes (and the digests in its markers).
CAUSAL_OUTPUT_SCHEMA = pa.schema([pa.field(S.ID, pa.string()), *CAUSAL_SCHEMA, pa.field(S.MODEL, pa.string())])


class CausalScorer(Stage):
    """The score stage of the causal-LM workload: read rows in, `CAUSAL_OUTPUT_SCHEMA` rows out: the
    scored rows first, then those that could not be read (error rows, in their input order).

    Tokenisation happens here, on the scoring actor, since it needs the BOS/EOS convention of the loaded
    LM; rows that could not be read stay error rows.
    """

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text to tokenise with the LM's boundary tokens and score",
        S.STATUS: "ok, or error for a row that could not be read (kept as an error row)",
        S.ERROR: "why the row could not be read",
    }
    writes = CAUSAL_OUTPUT_SCHEMA

    def __init__(self, spec: ModelSpec, batch_tokens: int | None = None) -> None:
        from ..engine.causal import CausalEngine, load_causal_lm

        self.engine = CausalEngine(load_causal_lm(spec), batch_tokens)
        self.signature = self.engine.lm.signature
        self.model_name = spec.name

    def process(self, rows: list[Row]) -> list[Row]:
        read = [r for r in rows if r[S.STATUS] == S.STATUS_OK]
        failed = [r for r in rows if r[S.STATUS] != S.STATUS_OK]
        scored = _scored_rows(self.engine, [r[S.TEXT] for r in read], self.report)
        unscored = [
            {S.TEXT: r[S.TEXT] or "", LOGP: None, S.N_TOKENS: 0, S.STATUS: r[S.STATUS], S.ERROR: r[S.ERROR]}
            for r in failed
        ]
        return [{**S.key(r), **out, S.MODEL: self.model_name} for r, out in zip(read + failed, scored + unscored)]


def _unchanged() -> Callable[[pa.Table], pa.Table]:
    return _identity


def _identity(table: pa.Table) -> pa.Table:
    """Not a `Stage`: it reads no column, and the base's trip through rows would only cost time."""
    return table


def causal_workload(model: ModelSpec, batch_tokens: int | None = None) -> Workload:
    """Causal-LM log P(W) with the model's BOS/EOS around each sentence (N-best rescoring).

    Its tokenisation depends on the loaded LM's boundary tokens, so it runs in the score stage.
    """
    return DECLARED.workload(CausalOptions(), _unchanged, partial(CausalScorer, model, batch_tokens), model.device)
