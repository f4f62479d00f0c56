"""The sampling workload (`dscore sample`, Goyal et al., 2022): Metropolis-Hastings chains from an MLM's energy.

Input rows are texts; the positions to sample are written with the model's mask token (the rest is fixed
context: conditional generation), or every non-special position with `free_all`. Each row starts
`chains` chains (seeds from the run's seed, the row's id and the chain's number, so results do not
depend on sharding) and writes one row per chain per recorded epoch after burn-in: the text, both
energies, and the proposals, acceptances and novel transitions since the previous record. The prepare
stage tokenises (tokenizer only) and makes error rows of what cannot be sampled; the score stage runs
`engine.sampler` on every chain of the shard at once (the engine, with torch, is imported there).
An input that cannot be sampled still gives its `chains` x records rows, as error rows, so that rows
in x `rows_per_input` = rows out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec
from ..engine.sampler_settings import STARTS as SAMPLER_STARTS
from ..engine.sampler_settings import SamplerSettings
from ..io import schema as S
from ..options import by_name, carried, check, option, words
from ..pipeline.memory import ROW_BYTES, TOKEN_BYTES, MemoryEstimate
from ..pipeline.progress import part
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .infill import ANSWER, allowed_tokens, example_seed, matches, surface, written_into
from .masked import SPANS, MaskedPreparer, unanswerable

if TYPE_CHECKING:
    from ..engine.masked_lm import MaskedLM

STARTS = ("auto", *SAMPLER_STARTS)  # auto: settled per row (`SampleScorer._start`)

CHAIN, EPOCH, ENERGY_RAW, ENERGY_NORM = "chain", "epoch", "energy_raw", "energy_norm"
DECLARED = Declaration(
    "sample",
    engines=("engine.sampler", "engine.energy"),
    docs="docs/sample.md",
    row_key=(CHAIN, EPOCH),
    output=lambda: OUTPUT_SCHEMA,
)
PROPOSALS, ACCEPTED, NOVEL, TEMPERATURE, CORRECT = "proposals", "accepted", "novel", "target_temperature", "correct"
SAMPLED = "sampled"  # the sampled tokens as they read, space-separated: what BLEU and accuracy judge
SAMPLE = "sample"  # the prepared rows' positions to sample

PREPARED_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(S.INPUT_IDS, pa.list_(pa.int64())),
        pa.field(SAMPLE, pa.list_(pa.int32())),
        pa.field(SPANS, pa.list_(pa.list_(pa.int32()))),
        pa.field(ANSWER, pa.string()),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
    ]
)

OUTPUT_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(CHAIN, pa.int32(), nullable=False),
        pa.field(EPOCH, pa.int32()),
        pa.field(S.TEXT, pa.string()),
        pa.field(SAMPLED, pa.string()),
        pa.field(ENERGY_RAW, pa.float64()),
        pa.field(ENERGY_NORM, pa.float64()),
        pa.field(PROPOSALS, pa.int32()),
        pa.field(ACCEPTED, pa.int32()),
        pa.field(NOVEL, pa.int32()),
        pa.field(TEMPERATURE, pa.float64()),
        pa.field(ANSWER, pa.string()),
        pa.field(CORRECT, pa.int32()),
        pa.field("n_sampled", pa.int32(), nullable=False),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
        pa.field(S.MODEL, pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class SampleOptions:
    """What changes a sampling run's rows (every field enters the run's fingerprint): the engine's settings
    (`engine.sampler_settings.SamplerSettings`, carried by name, with their flags and checks) and the
    workload's own fields (chains per row, seed, which positions, the vocabulary, the answers)."""

    energy: str = carried(SamplerSettings, "energy")
    sampler: str = carried(SamplerSettings, "sampler")
    epochs: int = carried(SamplerSettings, "epochs")
    burn_in: int = carried(SamplerSettings, "burn_in")
    chains: int = option(1, "chains per input row (default 1)", low=1)
    seed: int = option(0, "seed (with each row's id and chain number)")
    free_all: bool = option(False, "sample every position, starting from the given text")
    block: int = carried(SamplerSettings, "block")
    block_decay: int = carried(SamplerSettings, "block_decay")
    proposal_temperature: float = carried(SamplerSettings, "proposal_temperature")
    target_temperature: float = carried(SamplerSettings, "target_temperature")
    anneal: float = carried(SamplerSettings, "anneal")
    top_p: float = carried(SamplerSettings, "top_p")
    record_every: int = carried(SamplerSettings, "record_every")
    order: str = carried(SamplerSettings, "order")
    start: str = option(  # warm where the sampled positions hold mask tokens, else as given
        "auto", "auto: warm (greedy fill) where mask tokens are sampled, else as given", choices=STARTS
    )
    vocab_restrict: tuple[str, ...] | None = option(
        None, "the only tokens a proposal may use, space-separated (as in dscore infill)", read=words
    )
    answer_column: str = option(
        ANSWER, "column with the true tokens at the sampled positions, space-separated (optional)"
    )
    forced_accept: int = carried(SamplerSettings, "forced_accept", later=True)

    def __post_init__(self) -> None:
        check(self)
        self.settings()  # the engine's checks across its fields

    def settings(self, start: str = SAMPLER_STARTS[0]) -> SamplerSettings:
        """The engine's settings of these options, for chains that start `start` (`auto` is settled per row)."""
        return by_name(SamplerSettings, self, start=start)

    @property
    def recorded_epochs(self) -> list[int]:
        """The epochs (burn-in included) each chain records: every `record_every` after burn-in, and always
        the last (as `engine.sampler.Sampler.run`)."""
        last = self.burn_in + self.epochs
        return [*range(self.burn_in + self.record_every, last, self.record_every), last]

    @property
    def records(self) -> int:
        """Rows per chain: len(recorded_epochs), counted without listing them (--epochs may be huge)."""
        return len(range(self.burn_in + self.record_every, self.burn_in + self.epochs, self.record_every)) + 1


class SamplePreparer(MaskedPreparer):
    """Settles the positions to sample, and makes error rows of what cannot be sampled."""

    reads = {**MaskedPreparer.reads, S.TEXT: "the text (mask tokens mark the positions to sample)"}
    writes = PREPARED_SCHEMA
    positions = SAMPLE

    def carried(self, row: Row) -> Row:
        return {ANSWER: row.get(self.options.answer_column)}

    def locate(self, row: Row, ids: list[int], offsets: Sequence[tuple[int, int]]) -> Row | str:
        t = self.tokenizer
        specials = {t.cls_token_id, t.sep_token_id, t.bos_token_id, t.eos_token_id, t.pad_token_id} - {None}
        every = [i for i, token in enumerate(ids) if token not in specials]
        sample = every if self.options.free_all else self.masks(ids)
        if not sample:
            return (
                f"nothing to sample: no mask token {t.mask_token!r} in the text; mark the positions to sample "
                "with it, or pass --free-all to sample every position"
            )
        return unanswerable(row.get(self.options.answer_column), len(sample), "sampled positions") or {SAMPLE: sample}


class SampleScorer(Stage):
    """Runs every chain of a shard's samplable rows at once; error rows pass through."""

    reads = {name: f"from the sample prepare stage ({name})" for name in PREPARED_SCHEMA.names}
    writes = OUTPUT_SCHEMA

    def __init__(
        self, model: ModelSpec, options: SampleOptions, batch_tokens: int | None = None, mlm: MaskedLM | None = None
    ) -> None:
        from ..engine.masked_lm import load_masked_lm
        from ..engine.sampler import Sampler

        self.mlm = mlm or load_masked_lm(model)
        self.options, self.model_name = options, model.name
        allowed = allowed_tokens(self.mlm.tokenizer, self.mlm.model.config.vocab_size, options.vocab_restrict)
        self.sampler = Sampler(self.mlm, allowed, batch_tokens)
        self.settings = {start: options.settings(start) for start in SAMPLER_STARTS}
        self.signature = {**self.mlm.signature, "sampler": options.sampler, "energy": options.energy}

    def process(self, rows: list[Row]) -> list[Row]:
        from ..engine.energy import sequence_positions
        from ..engine.sampler import Chain

        groups: dict[str, list[tuple[int, Chain]]] = {}
        for r, row in enumerate(rows):
            if row[S.STATUS] != S.STATUS_OK:
                continue
            ids = np.array(row[S.INPUT_IDS], dtype=np.int64)
            sample = np.array(row[SAMPLE], dtype=np.int64)
            start = self._start(ids, sample)
            for c in range(self.options.chains):
                seed = example_seed(self.options.seed, f"{row[S.ID]}/{c}")
                groups.setdefault(start, []).append((r, Chain(ids, sample, sequence_positions(self.mlm, ids), seed)))
        records: dict[int, list] = {}
        for g, (start, chains) in enumerate(groups.items()):
            report = part(self.report, g, len(groups))
            for (r, _), recs in zip(
                chains, self.sampler.run([c for _, c in chains], self.settings[start], report=report)
            ):
                records.setdefault(r, []).append(recs)
        out = []
        for r, row in enumerate(rows):
            out += self._rows(row, records.get(r))
        return out

    def _start(self, ids: np.ndarray, sample: np.ndarray) -> str:
        if self.options.start != "auto":
            return self.options.start
        return "warm" if (ids[sample] == self.mlm.mask_token_id).any() else "given"

    def _rows(self, row: Row, chains: list[list] | None) -> list[Row]:
        base = {
            **S.key(row),
            ANSWER: row[ANSWER],
            S.MODEL: self.model_name,
            "n_sampled": 0,
            S.STATUS: row[S.STATUS],
            S.ERROR: row[S.ERROR],
        }
        if chains is None:
            empty = {name: None for name in OUTPUT_SCHEMA.names if name not in base}
            return [
                {**empty, **base, CHAIN: c, EPOCH: epoch, S.TEXT: row[S.TEXT]}  # (id, chain, epoch) stays a key
                for c in range(self.options.chains)
                for epoch in self.options.recorded_epochs
            ]
        answer = row[ANSWER].split() if row[ANSWER] is not None else None
        out = []
        for c, records in enumerate(chains):
            for record in records:
                tokens = self.mlm.tokenizer.convert_ids_to_tokens(record.ids[row[SAMPLE]].tolist())
                correct = (
                    None if answer is None else sum(matches(self.mlm.tokenizer, t, a) for t, a in zip(tokens, answer))
                )
                out.append(
                    {
                        **base,
                        CHAIN: c,
                        EPOCH: record.epoch,
                        S.TEXT: self._text(row, record.ids, tokens),
                        SAMPLED: " ".join(surface(self.mlm.tokenizer, t) for t in tokens),
                        ENERGY_RAW: record.energy_raw,
                        ENERGY_NORM: record.energy_norm,
                        PROPOSALS: record.proposals,
                        ACCEPTED: record.accepted,
                        NOVEL: record.novel,
                        TEMPERATURE: record.target_temperature,
                        CORRECT: correct,
                        "n_sampled": len(tokens),
                    }
                )
        return out

    def _text(self, row: Row, ids: np.ndarray, tokens: Sequence[str]) -> str:
        """The chain's text: the input with each sampled token as it reads (`--free-all`: decoded)."""
        if self.options.free_all:
            return self.mlm.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        return written_into(self.mlm.tokenizer, row[S.TEXT], row[SPANS], tokens)


def memory_estimate(options: SampleOptions, shard_rows: int, tokens: int) -> MemoryEstimate:
    """What one shard holds at once: every chain's records (kept until the shard is written), as rows."""
    rows = shard_rows * options.chains * options.records
    return MemoryEstimate(
        rows * (ROW_BYTES + TOKEN_BYTES * tokens),
        f"one shard of {shard_rows} rows x {options.chains:,} chains x {options.records:,} recorded epochs",
        "--epochs (or record fewer epochs with a larger --record-every), --chains or --shard-rows",
    )


def sample_workload(model: ModelSpec, options: SampleOptions, batch_tokens: int | None = None) -> Workload:
    """MH chains from an MLM's energy (`dscore sample`): `chains` x records rows per input row."""
    return DECLARED.workload(
        options,
        partial(SamplePreparer, model, options),
        partial(SampleScorer, model, options, batch_tokens),
        model.device,
        rows_per_input=options.chains * options.records,
    )
