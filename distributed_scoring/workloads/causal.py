"""The causal-LM workload of N-best rescoring: log P(W) of each text with the model's BOS/EOS around it.

Its tokenisation depends on the loaded LM's boundary tokens (see `causal`), so it runs in the score
stage; the prepare stage passes rows through.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..io import schema as S
from ..config import ModelSpec
from ..io.schema import LOGP
from ..pipeline.workload import Workload

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


@dataclass(frozen=True)
class CausalOptions:
    """A causal LM's log P(W) has no option yet: the model and its boundary tokens settle it."""


def score_texts(engine: CausalEngine, texts: Sequence[str]) -> pa.Table:
    """One `CAUSAL_SCHEMA` row per text: log P(W) and |W|, or an error row (blank, too long)."""
    from ..engine.causal import encode

    encoded = encode(engine.lm, texts)
    ok = [i for i, e in enumerate(encoded) if not isinstance(e, str)]
    logprobs = dict(zip(ok, engine.token_logprobs([encoded[i] for i in ok])))
    columns: dict[str, list] = {name: [] for name in CAUSAL_SCHEMA.names}
    tail = 0 if engine.lm.eos_id is None else 1
    for i, (text, e) in enumerate(zip(texts, encoded)):
        error = e if isinstance(e, str) else None
        columns[S.TEXT].append(text)
        columns[LOGP].append(None if error else float(logprobs[i].sum()))
        columns[S.N_TOKENS].append(0 if error else len(e) - 1 - tail)
        columns[S.STATUS].append(S.STATUS_ERROR if error else S.STATUS_OK)
        columns[S.ERROR].append(error)
    return pa.Table.from_pydict(columns, schema=CAUSAL_SCHEMA)


CAUSAL_OUTPUT_SCHEMA = pa.schema(
    [pa.field(S.ID, pa.string(), nullable=False), *CAUSAL_SCHEMA, pa.field(S.MODEL, pa.string(), nullable=False)]
)


class CausalScorer:
    """The score stage of the causal-LM workload: read rows in, `CAUSAL_OUTPUT_SCHEMA` rows out.

    Tokenisation happens here, on the scoring actor, since it needs the BOS/EOS convention of the loaded
    LM; rows that could not be read stay error rows.
    """

    def __init__(self, spec: ModelSpec, batch_tokens: int | None = None) -> None:
        from ..engine.causal import CausalEngine, load_causal_lm

        self.engine = CausalEngine(load_causal_lm(spec), batch_tokens)
        self.signature = self.engine.lm.signature
        self.model_name = spec.name

    def __call__(self, rows: pa.Table) -> pa.Table:
        ok = pc.equal(rows[S.STATUS], S.STATUS_OK)
        scored = score_texts(self.engine, rows.filter(ok)[S.TEXT].to_pylist())
        failed = rows.filter(pc.invert(ok))
        unscored = pa.table({
            S.TEXT: failed[S.TEXT].fill_null(""), LOGP: pa.nulls(failed.num_rows, pa.float64()),
            S.N_TOKENS: pa.array([0] * failed.num_rows, pa.int32()), S.STATUS: failed[S.STATUS], S.ERROR: failed[S.ERROR],
        }, schema=CAUSAL_SCHEMA)
        table = pa.concat_tables([scored, unscored])
        ids = pa.concat_arrays([rows.filter(ok)[S.ID].combine_chunks(), failed[S.ID].combine_chunks()])
        return table.add_column(0, S.ID, ids).append_column(S.MODEL, pa.array([self.model_name] * table.num_rows))


def _unchanged() -> Callable[[pa.Table], pa.Table]:
    return _identity


def _identity(table: pa.Table) -> pa.Table:
    return table


def causal_workload(model: ModelSpec, batch_tokens: int | None = None) -> Workload:
    """Causal-LM log P(W) with the model's BOS/EOS around each sentence (N-best rescoring).

    Its tokenisation depends on the loaded LM's boundary tokens, so it runs in the score stage.
    """
    return Workload("causal", CausalOptions(), _unchanged, partial(CausalScorer, model, batch_tokens), model.device)
