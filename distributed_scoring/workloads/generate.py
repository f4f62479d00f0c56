"""The generation workload (`dscore generate`): u-PMLM's Algorithm 1 (Liao et al., 2020) on many prompts.

A prompt is a text with the model's mask token at each position to generate; its other tokens stay as
they are, which is how a prefix, a suffix or tokens anywhere constrain the generation, as in the paper's
examples (`dscore generate --length N` writes prompts of N mask tokens alone). Each prompt gives
`sequences` sequences (one with `length`, whose prompts are the sequences). A sequence fills its masks
one at a time in its order: `l2r`, `r2l`, `random` (a permutation drawn from the run's seed, the row's
id and the sequence's number, so results do not depend on sharding) or `given` (a column of the input:
the masks' indices 0 .. k-1 in reading order, listed in fill order, e.g. `[2, 0, 1]` or "2 0 1"). At each
step the token is the most probable one (`temperature` 0: greedy) or drawn after temperature, top-k and
top-p filtering; special tokens are never generated. The generation itself is the infilling engine's
(`engine.infill`, order `given`, decoder `standard` with one beam or `filtered`), so every sequence of a
shard goes through one packed forward pass per step. Each row carries the text, the generated tokens,
the order they were filled in, and their chain log-likelihood given the prompt's fixed tokens:
sum_k log p(x_sigma(k) | x_sigma(<k), fixed tokens, the rest masked), natural log, unfiltered softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec
from ..engine.orders import orders_for
from ..errors import UserError
from ..io import schema as S
from ..options import check, option, words
from ..pipeline.memory import BEAM_BYTES, CANDIDATE_BYTES, ROW_BYTES, TOKEN_BYTES, MemoryEstimate
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .infill import MASKS, allowed_tokens, example_seed, written_into
from .masked import SPANS, MaskedPreparer
from .pll import isolated

if TYPE_CHECKING:
    from ..engine.infill import Fill

GENERATION_ORDERS = ("random", "l2r", "r2l", "given")  # `given`: each prompt's own order
SEQUENCE, PROMPT, TOKENS, FILL_ORDER, ORDER, LOG_LIKELIHOOD = (
    "sequence",
    "prompt",
    "tokens",
    "fill_order",
    "order",
    "log_likelihood",
)
# The infilling engine generates; the chain engine draws the orders.
DECLARED = Declaration(
    "generate",
    engines=("engine.infill", "engine.chain"),
    docs="docs/generate.md",
    row_key=(SEQUENCE,),
    output=lambda: OUTPUT_SCHEMA,
)

PREPARED_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(S.INPUT_IDS, pa.list_(pa.int64())),
        pa.field(MASKS, pa.list_(pa.int32())),
        pa.field(SPANS, pa.list_(pa.list_(pa.int32()))),
        pa.field(FILL_ORDER, pa.list_(pa.int32())),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
    ]
)

OUTPUT_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(SEQUENCE, pa.int32(), nullable=False),
        pa.field(PROMPT, pa.string()),
        pa.field(S.TEXT, pa.string()),
        pa.field(TOKENS, pa.list_(pa.string())),
        pa.field(FILL_ORDER, pa.list_(pa.int32())),
        pa.field(LOG_LIKELIHOOD, pa.float64()),
        pa.field(S.N_TOKENS, pa.int32(), nullable=False),
        pa.field(ORDER, pa.string(), nullable=False),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
        pa.field(S.MODEL, pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class GenerateOptions:
    """What changes a generation run's rows (every field enters the run's fingerprint), each declared with its
    `dscore generate` flag."""

    order: str = option(
        "random",
        "fill order: random (default; seeded per sequence), l2r, r2l, or given per row",
        choices=GENERATION_ORDERS,
    )
    sequences: int = option(  # per prompt; with `length`, the number of prompts (one sequence each)
        1, "sequences per prompt; with --length, how many sequences (default 1)", low=1, name="--num-sequences"
    )
    temperature: float = option(
        1.0, "sampling temperature; 0: greedy, the most probable token at each step (default 1)", low=0
    )
    top_k: int = option(0, "sample among the k most probable tokens (default 0: off)", low=0)
    top_p: float = option(1.0, "nucleus sampling's p (default 1: off)", low=0, high=1, above=True)
    seed: int = option(0, "seed of the orders and samples (with each row's id)")
    vocab_restrict: tuple[str, ...] | None = option(  # None: every non-special token
        None, "the only tokens that may be generated, space-separated (as in dscore infill)", read=words
    )
    length: int | None = option(  # prompts of this many mask tokens alone (no inputs); texts are decoded
        None, "no INPUTS: generate sequences of this many tokens", low=1, type=int
    )
    order_column: str = option(
        FILL_ORDER,
        "with --order given: the column listing the masks' indices (0 .. k-1, in reading order) in "
        'fill order, as a JSON list or "2 0 1" (default: fill_order, as the output writes it)',
    )

    def __post_init__(self) -> None:
        check(self)
        if self.length is not None and self.order == "given":
            raise UserError("--order given reads each prompt's order from its input row; --length has no inputs")

    @property
    def per_prompt(self) -> int:
        """Sequences (output rows) per prompt row."""
        return 1 if self.length is not None else self.sequences


def given_order(value: str | None, masks: int, column: str) -> list[int] | str:
    """A row's `given` fill order as mask indices, or the error of a value that is not a permutation of
    0 .. masks-1 (written as a JSON list, or numbers separated by spaces or commas)."""
    if value is None:
        return f"no {column!r} value: --order given needs the masks' fill order in each row (e.g. [2, 0, 1])"
    try:
        order = [int(v) for v in value.replace(",", " ").strip("[] ").split()]
    except ValueError:
        order = None
    if order is None or sorted(order) != list(range(masks)):
        return (
            f"{column} {value!r} is not a permutation of the {masks} mask indices 0 .. {masks - 1} "
            "(masks counted in reading order)"
        )
    return order


class GeneratePreparer(MaskedPreparer):
    """Finds the masks (and a `given` order), and makes error rows of what cannot be generated."""

    reads = {**MaskedPreparer.reads, S.TEXT: "the prompt: a text with mask tokens where tokens are generated"}
    writes = PREPARED_SCHEMA
    positions = MASKS

    def locate(self, row: Row, ids: list[int], offsets: Sequence[tuple[int, int]]) -> Row | str:
        masks = self.masks(ids)
        if not masks:
            mask = self.tokenizer.mask_token
            return f"no mask token {mask!r} in the text: write one {mask} for each token to generate (or use --length)"
        if self.options.order != "given":
            return {MASKS: masks}
        order = given_order(row.get(self.options.order_column), len(masks), self.options.order_column)
        return order if isinstance(order, str) else {MASKS: masks, FILL_ORDER: order}


class GenerateScorer(Stage):
    """Generates every sequence of a shard's prompts at once; error rows pass through (one per sequence)."""

    reads = {name: f"from the generate prepare stage ({name})" for name in PREPARED_SCHEMA.names}
    writes = OUTPUT_SCHEMA

    def __init__(self, model: ModelSpec, options: GenerateOptions, batch_tokens: int | None = None) -> None:
        from ..engine.infill import InfillEngine, InfillSettings
        from ..engine.masked_lm import load_masked_lm

        self.mlm = load_masked_lm(model)
        self.options, self.model_name = options, model.name
        allowed = allowed_tokens(self.mlm.tokenizer, self.mlm.model.config.vocab_size, options.vocab_restrict)
        self.engine = InfillEngine(self.mlm, allowed, batch_tokens)
        o = options
        if o.temperature == 0:  # greedy: a beam search of one beam
            self.settings = InfillSettings("standard", "given", beam=1)
        else:
            self.settings = InfillSettings(
                "filtered", "given", 1, temperature=o.temperature, top_k=o.top_k, top_p=o.top_p
            )
        self.signature = {**self.mlm.signature, ORDER: o.order, "temperature": o.temperature}

    def process(self, rows: list[Row]) -> list[Row]:
        from ..engine.infill import InfillExample

        work = [
            (r, n) for r, row in enumerate(rows) if row[S.STATUS] == S.STATUS_OK for n in range(self.options.per_prompt)
        ]
        examples = []
        for r, n in work:
            ids, masks = np.array(rows[r][S.INPUT_IDS], dtype=np.int64), np.array(rows[r][MASKS], dtype=np.int64)
            seed = example_seed(self.options.seed, f"{rows[r][S.ID]}/{n}")
            examples.append(InfillExample(ids, masks, seed, self._order(rows[r], masks, seed)))
        fills = dict(zip(work, isolated(self._generate, examples)))
        per_prompt = range(self.options.per_prompt)
        return [self._row(row, n, fills.get((r, n))) for r, row in enumerate(rows) for n in per_prompt]

    def _order(self, row: Row, masks: np.ndarray, seed: int) -> np.ndarray:
        """The positions in fill order: the row's `given` one, or l2r, r2l or a permutation from `seed`."""
        if self.options.order == "given":
            return masks[row[FILL_ORDER]]
        return orders_for(masks, self.options.order, 1, np.random.default_rng([seed, 1]))[0]

    def _generate(self, examples: Sequence) -> list[Fill]:
        return [fills[0] for fills in self.engine.search(examples, self.settings, self.report)]

    def _row(self, row: Row, n: int, fill: Fill | str | None) -> Row:
        error = fill if isinstance(fill, str) else row[S.ERROR]
        out = {
            **S.key(row),
            SEQUENCE: n,
            PROMPT: None if self.options.length else row[S.TEXT],
            S.TEXT: None,
            TOKENS: None,
            FILL_ORDER: None,
            LOG_LIKELIHOOD: None,
            S.N_TOKENS: 0,
            ORDER: self.options.order,
            S.STATUS: S.STATUS_ERROR if error else S.STATUS_OK,
            S.ERROR: error,
            S.MODEL: self.model_name,
        }
        if error is not None or fill is None:
            return out
        masks = list(row[MASKS])
        tokens = self.mlm.tokenizer.convert_ids_to_tokens(fill.tokens.tolist())
        out.update(
            {
                S.TEXT: self._text(row, fill, tokens),
                TOKENS: tokens,
                LOG_LIKELIHOOD: fill.chain,
                FILL_ORDER: [masks.index(p) for p in fill.order],
                S.N_TOKENS: len(masks),
            }
        )
        return out

    def _text(self, row: Row, fill: Fill, tokens: list[str]) -> str:
        """The prompt with each mask replaced by its token as it reads; with --length, the decoded tokens."""
        if self.options.length is None:
            return written_into(self.mlm.tokenizer, row[S.TEXT], row[SPANS], tokens)
        ids = np.array(row[S.INPUT_IDS], dtype=np.int64)
        ids[row[MASKS]] = fill.tokens
        return self.mlm.tokenizer.decode(ids.tolist(), skip_special_tokens=True)


def memory_estimate(options: GenerateOptions, shard_rows: int, tokens: int, n_allowed: int) -> MemoryEstimate:
    """What one shard holds at once: its sequences (each a one-beam search over the allowed tokens) as rows."""
    rows = shard_rows * options.per_prompt
    per_row = ROW_BYTES + TOKEN_BYTES * tokens + BEAM_BYTES + 8 * tokens + CANDIDATE_BYTES * n_allowed
    return MemoryEstimate(
        rows * per_row,
        f"one shard of {shard_rows} prompts x {options.per_prompt:,} sequences",
        "--num-sequences or --shard-rows",
    )


def generate_workload(model: ModelSpec, options: GenerateOptions, batch_tokens: int | None = None) -> Workload:
    """Generation in any order (`dscore generate`): `per_prompt` rows per prompt row."""
    return DECLARED.workload(
        options,
        partial(GeneratePreparer, model, options),
        partial(GenerateScorer, model, options, batch_tokens),
        model.device,
        rows_per_input=options.per_prompt,
    )
