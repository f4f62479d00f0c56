"""The pairwise-joints workload (Torroba-Hennigen et al., 2023): its options, its two stages and its rows.

The prepare stage tokenises the examples and settles their two token indices: given, or drawn from the
sentence's own tokens with a generator seeded by (seed, id), so results do not depend on sharding. The
score stage runs the conditionals (2|V| passes per example, batched) and writes one row per example and
construction. The engines (torch) are imported by the scorer on its actor, never on the driver.
Positions are 0-based indices into the model's tokens with special tokens excluded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from numbers import Integral
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..config import ModelSpec
from ..engine.joint_stats import CONSTRUCTIONS, JointOptions
from ..io import schema as S
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .prepare import PLLPreparer

if TYPE_CHECKING:
    from ..engine.masked_lm import MaskedLM

SCHEMES = ("random", "contiguous")  # how a pair is drawn when none is given (`draw_pair`)

A, B, TOKEN_A, TOKEN_B, CONSTRUCTION = "a", "b", "token_a", "token_b", "construction"
# Its runs are named `joints-<scheme>`; one row per example and construction.
DECLARED = Declaration(
    "joints", engines=("engine.joints", "engine.conditionals"), docs="docs/joints.md", row_key=(CONSTRUCTION,)
)
LOG_PAIR, LOG_UNARY_A, LOG_UNARY_B, A_KL, G_KL, AG_CHANGE = (
    "log_pair",
    "log_unary_a",
    "log_unary_b",
    "a_kl",
    "g_kl",
    "ag_change",
)

EXAMPLES_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(A, pa.int32()),
        pa.field(B, pa.int32()),
        pa.field(S.ERROR, pa.string()),
    ]
)
JOINTS_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(A, pa.int32()),
        pa.field(B, pa.int32()),
        pa.field(TOKEN_A, pa.string()),
        pa.field(TOKEN_B, pa.string()),
        pa.field(CONSTRUCTION, pa.string(), nullable=False),
        pa.field(LOG_PAIR, pa.float64()),
        pa.field(LOG_UNARY_A, pa.float64()),
        pa.field(LOG_UNARY_B, pa.float64()),
        pa.field(A_KL, pa.float64()),
        pa.field(G_KL, pa.float64()),
        pa.field(AG_CHANGE, pa.float64()),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
        pa.field(S.MODEL, pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class PairwiseOptions:
    """What changes a joints run's rows (the scheme is in the workload's name): the seed of the drawn
    positions, the constructions' options and the vocabulary restriction."""

    seed: int
    ag_iterations: int
    hcb_pivot: str | int
    top_k: int | None

    @classmethod
    def of(cls, seed: int, options: JointOptions, top_k: int | None) -> "PairwiseOptions":
        return cls(seed, options.ag_iterations, options.pivot, top_k)


def joints_workload(
    model: ModelSpec,
    examples_file: str,
    scheme: str,
    seed: int,
    options: JointOptions,
    batch_tokens: int | None,
    top_k: int | None,
) -> Workload:
    return DECLARED.workload(
        PairwiseOptions.of(seed, options, top_k),
        partial(PairPreparer, model, examples_file, scheme, seed),
        partial(JointsScorer, model, options, batch_tokens, top_k),
        model.device,
        rows_per_input=len(CONSTRUCTIONS),
        name=f"{DECLARED.name}-{scheme}",
    )


def is_pair(a: object, b: object) -> bool:
    """Whether a given pair is two different token indices >= 0 (whether they fit a sentence is checked
    once it is tokenised)."""
    return all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in (a, b)) and a != b


def draw_pair(n_tokens: int, scheme: str, rng: random.Random) -> tuple[int, int]:
    """Two token indices: uniformly at random (a < b), or a random adjacent pair."""
    if scheme == "contiguous":
        a = rng.randrange(n_tokens - 1)
        return a, a + 1
    a, b = sorted(rng.sample(range(n_tokens), 2))
    return a, b


class PairPreparer(Stage):
    """Tokenises the examples and settles their two token indices (given, or drawn by the scheme)."""

    reads = PLLPreparer.reads

    def __init__(self, model: ModelSpec, examples_file: str, scheme: str, seed: int) -> None:
        from ..engine.model_files import load_tokenizer

        self.preparer = PLLPreparer(*load_tokenizer(model))
        self.scheme, self.seed = scheme, seed
        table = pq.read_table(examples_file, columns=[S.ID, A, B, S.ERROR])
        self.given = {r[S.ID]: r for r in table.to_pylist()}

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return pa.schema([*self.preparer.output_schema(columns), pa.field(A, pa.int32()), pa.field(B, pa.int32())])

    def process(self, rows: list[Row]) -> list[Row]:
        return [with_pair(row, self.given[row[S.ID]], self.scheme, self.seed) for row in self.preparer.process(rows)]


def with_pair(row: Row, example: Row, scheme: str, seed: int) -> Row:
    """A prepared row with its pair (`a`, `b`): the example's own (`a`, `b`, `error` keys; a None `a`
    draws one by `scheme`, seeded by (seed, id)), or an error row saying why it has none."""
    pair = _pair(row, example, scheme, seed)
    # The example's own problem first (a malformed given pair), then reading/tokenising, then the pair.
    error = example[S.ERROR] or row[S.ERROR] or (pair if isinstance(pair, str) else None)
    a, b = pair if isinstance(pair, tuple) else (None, None)
    return {**row, S.STATUS: S.STATUS_ERROR if error else S.STATUS_OK, S.ERROR: error, A: a, B: b}


def _pair(row: Row, example: Row, scheme: str, seed: int) -> tuple[int, int] | str | None:
    """The pair, an error message, or None for a row that already failed."""
    if example[S.ERROR]:
        return example[S.ERROR]
    if row[S.STATUS] != S.STATUS_OK:
        return None
    n = len(row[S.TARGETS])
    if example[A] is not None:
        if max(example[A], example[B]) >= n:
            return f"positions [{example[A]}, {example[B]}] out of range: the sentence has {n} non-special tokens"
        return example[A], example[B]
    if n < 2:
        return "a pair needs at least two non-special tokens"
    return draw_pair(n, scheme, random.Random(f"{seed}/{row[S.ID]}"))


class JointsScorer(Stage):
    """Conditionals (2|V| passes per example, batched) and the five constructions' metrics."""

    reads = {
        S.ID: "the example's id, kept",
        S.TEXT: "the text, kept",
        S.STATUS: "ok, or error for an example that could not be read, tokenised or paired",
        S.ERROR: "why the example could not be read, tokenised or paired",
        S.INPUT_IDS: "the model's token ids, special tokens included",
        S.TARGETS: "the positions of input_ids that are not special tokens",
        A: "the pair's first token, an index into targets",
        B: "the pair's second token, an index into targets",
    }
    writes = JOINTS_SCHEMA

    def __init__(
        self,
        model: ModelSpec,
        options: JointOptions,
        batch_tokens: int | None,
        top_k: int | None,
        mlm: MaskedLM | None = None,
    ) -> None:
        from ..engine.conditionals import ConditionalsEngine
        from ..engine.masked_lm import load_masked_lm

        self.mlm = mlm or load_masked_lm(model)
        self.engine = ConditionalsEngine(self.mlm, batch_tokens, top_k)
        self.options, self.model_name = options, model.name
        self.signature = {
            **self.mlm.signature,
            "ag_iterations": options.ag_iterations,
            "hcb_pivot": options.pivot,
            "top_k": top_k,
        }

    def process(self, rows: list[Row]) -> list[Row]:
        from ..engine.conditionals import Pair
        from ..engine.joints import score_pair

        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        pairs = [
            Pair(np.asarray(rows[i][S.INPUT_IDS]), np.asarray(rows[i][S.TARGETS]), rows[i][A], rows[i][B]) for i in ok
        ]
        scores: dict[int, Any] = {}
        for done, (index, cond) in enumerate(self.engine.conditionals(pairs), 1):
            scores[ok[index]] = score_pair(cond, self.options)
            self.report(done, len(pairs))
        out = []
        for i, row in enumerate(rows):
            tokens = self._gold_tokens(row) if i in scores else (None, None)
            for name in CONSTRUCTIONS:
                m = scores[i].metrics[name] if i in scores else None
                out.append(
                    {
                        S.ID: row[S.ID],
                        S.TEXT: row[S.TEXT],
                        A: row[A],
                        B: row[B],
                        TOKEN_A: tokens[0],
                        TOKEN_B: tokens[1],
                        CONSTRUCTION: name,
                        LOG_PAIR: m and m.log_pair,
                        LOG_UNARY_A: m and m.log_unary_a,
                        LOG_UNARY_B: m and m.log_unary_b,
                        A_KL: m and m.a_kl,
                        G_KL: m and m.g_kl,
                        AG_CHANGE: scores[i].ag_change if i in scores and name == "AG" else None,
                        S.STATUS: S.STATUS_OK if m else S.STATUS_ERROR,
                        S.ERROR: None if m else row[S.ERROR],
                        S.MODEL: self.model_name,
                    }
                )
        return out

    def _gold_tokens(self, row: Row) -> tuple[str, str]:
        ids = [row[S.INPUT_IDS][row[S.TARGETS][k]] for k in (row[A], row[B])]
        return tuple(self.mlm.tokenizer.convert_ids_to_tokens(ids))
