"""Driver-side aggregation over the written Parquet files: the no-loss check and `summary.json`.

Reads only four small columns, one file at a time, so memory stays flat however large the corpus.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Callable, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..config import RunConfig
from ..errors import DataLossError
from ..io import schema as S
from ..io.output import SUMMARY_FILE, OutputDir
from ..io.sources import Shard
from .stats import STAT_COLUMNS, CorpusStats

logger = logging.getLogger(__name__)

Stats = TypeVar("Stats")  # a summable record of rows' figures (`a + b`), as `CorpusStats`

MOSTLY_UNKNOWN = 0.5  # a row is "mostly unknown" when more than this share of its scored tokens are unknown
SUMMARY_VERSION = 1  # of summary.json
UNKNOWN_ROWS_WARNING = 0.1  # summary.json warns when more than this share of ok rows are mostly unknown


def check_complete(out: OutputDir, plan: list[Shard], rows_per_input: int = 1) -> list[dict]:
    """Every planned shard marked done and holding exactly its rows (rows in x `rows_per_input` ==
    rows out), from the markers and the files' metadata alone; returns the scorers' distinct signatures."""
    problems = []
    signatures: dict[str, dict] = {}
    marked = set(out.marked_parts())  # a file in rows/ without a marker is named in a warning, never counted
    for shard in plan:
        marker = out.read_marker(shard.key) if out.part_path(shard.key) in marked else None
        if marker is None:
            problems.append(
                f"shard {shard.key} ({shard.file.path}, rows {shard.start + 1}-{shard.start + shard.rows}) is not done"
            )
            continue
        signatures[repr(sorted(marker["signature"].items()))] = marker["signature"]
        rows = pq.read_metadata(out.part_path(shard.key), filesystem=out.fs).num_rows
        if rows != shard.rows * rows_per_input:
            problems.append(f"shard {shard.key} has {rows} rows, expected {shard.rows * rows_per_input}")
    if problems:
        raise DataLossError(
            f"{sum(s.rows for s in plan)} rows in, fewer out: "
            + "; ".join(problems[:5])
            + (" ..." if len(problems) > 5 else "")
            + ". Rerun the same command to score the unfinished shards."
        )
    return list(signatures.values())


def summarize(out: OutputDir, plan: list[Shard], config: RunConfig) -> dict:
    """Check that every planned row was written exactly once, sum the statistics, write summary.json."""
    signatures = check_complete(out, plan)
    stats = CorpusStats()
    by_input: dict[str, CorpusStats] = {}
    by_partition: dict[str | None, CorpusStats] = {}
    n_unknown, mostly_unknown = 0, 0
    columns = STAT_COLUMNS + ([S.PARTITION] if config.inputs.partitioned else [])
    for shard in plan:
        part = pq.ParquetFile(out.part_path(shard.key), filesystem=out.fs)
        counted = columns + ([S.N_UNKNOWN] if S.N_UNKNOWN in part.schema_arrow.names else [])
        for batch in part.iter_batches(columns=counted):
            unknown, mostly = unknown_tokens(batch)
            n_unknown, mostly_unknown = n_unknown + unknown, mostly_unknown + mostly
            batch_stats = CorpusStats.of_table(batch)
            stats += batch_stats
            by_input[shard.file.name] = by_input.get(shard.file.name, CorpusStats()) + batch_stats
            if config.inputs.partitioned:
                add_by_partition(by_partition, pa.Table.from_batches([batch]), CorpusStats.of_table)
    expected = sum(s.rows for s in plan)
    if stats.rows != expected:
        raise DataLossError(f"{expected} rows in, {stats.rows} rows out; rerun the same command")
    summary = Summary(
        stats=stats,
        rows_expected=expected,
        model=config.model.name,
        variant=config.scoring.variant,
        inputs=list(config.inputs.paths),
        shards=len(plan),
        signature=one_or_all(signatures),
        by_input=by_input,
        n_unknown=n_unknown,
        mostly_unknown_rows=mostly_unknown,
        warnings=unknown_warnings(mostly_unknown, stats.ok),
        by_partition={str(name): s for name, s in sorted(by_partition.items(), key=str)}
        if config.inputs.partitioned
        else None,
    )
    for warning in summary.warnings:
        logger.warning(warning)
    out.write_json(SUMMARY_FILE, summary.to_json())
    return summary.to_json()


@dataclass(frozen=True)
class Summary:
    """summary.json: the corpus statistics (flattened into the top level on disk), what was scored, per
    input (and per partition when partitioned, else the key is absent), unknown tokens and warnings."""

    stats: CorpusStats
    rows_expected: int
    model: str
    variant: str
    inputs: list[str]
    shards: int
    signature: dict | list[dict] | None
    by_input: dict[str, CorpusStats]
    n_unknown: int
    mostly_unknown_rows: int
    warnings: list[str]
    by_partition: dict[str, CorpusStats] | None = None
    version: int = SUMMARY_VERSION

    def to_json(self) -> dict:
        data = {
            **self.stats.to_dict(),
            "version": self.version,
            "rows_expected": self.rows_expected,
            "model": self.model,
            "variant": self.variant,
            "inputs": self.inputs,
            "shards": self.shards,
            "signature": self.signature,
            "by_input": {name: s.to_dict() for name, s in self.by_input.items()},
            "n_unknown": self.n_unknown,
            "mostly_unknown_rows": self.mostly_unknown_rows,
            "warnings": self.warnings,
        }
        if self.by_partition is not None:
            data["by_partition"] = {name: s.to_dict() for name, s in self.by_partition.items()}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Summary":
        """A summary.json; files written before `version` existed are version 1 too."""
        partitions = data.get("by_partition")
        return cls(
            _stats(data),
            data["rows_expected"],
            data["model"],
            data["variant"],
            data["inputs"],
            data["shards"],
            data["signature"],
            {name: _stats(s) for name, s in data["by_input"].items()},
            data["n_unknown"],
            data["mostly_unknown_rows"],
            data["warnings"],
            {name: _stats(s) for name, s in partitions.items()} if partitions is not None else None,
            data.get("version", SUMMARY_VERSION),
        )


def _stats(data: dict) -> CorpusStats:
    """The summable fields of a `CorpusStats.to_dict` object (its PPPLs are derived)."""
    return CorpusStats(**{f.name: data[f.name] for f in fields(CorpusStats)})


def unknown_tokens(batch: pa.RecordBatch | pa.Table) -> tuple[int, int]:
    """(unknown tokens, rows mostly unknown) over the ok rows of a batch or table; (0, 0) for shards written
    before the `n_unknown` column existed."""
    if S.N_UNKNOWN not in batch.schema.names:
        return 0, 0
    ok = pc.equal(batch[S.STATUS], S.STATUS_OK)
    unknown, tokens = pc.filter(batch[S.N_UNKNOWN], ok), pc.filter(batch[S.N_TOKENS], ok)
    mostly = pc.greater(pc.multiply(unknown.cast(pa.float64()), 1 / MOSTLY_UNKNOWN), tokens)
    return int(pc.sum(unknown).as_py() or 0), int(pc.sum(mostly.cast(pa.int64())).as_py() or 0)


def unknown_warnings(mostly_unknown: int, ok_rows: int) -> list[str]:
    """The warning for a corpus the tokenizer cannot read, with what to do; none for a readable one."""
    if not ok_rows or mostly_unknown <= UNKNOWN_ROWS_WARNING * ok_rows:
        return []
    return [
        f"{mostly_unknown} of {ok_rows} scored rows ({mostly_unknown / ok_rows:.0%}) are mostly unknown tokens "
        f"(over {MOSTLY_UNKNOWN:.0%} of their tokens are the tokenizer's unknown token; see the n_unknown column): "
        "their scores mean little. Check that the text suits the model: a per-residue (protein, antibody) model "
        "needs one residue per word, which --split-chars does for sequences written without spaces; natural "
        "language needs a natural-language model; check --text-column"
    ]


def add_by_partition(totals: dict[str | None, Stats], table: pa.Table, of_table: Callable[[pa.Table], Stats]) -> None:
    """Add a batch's statistics (`of_table` of its rows: any summable record) per partition value (a row
    without a value counts under None)."""
    for value in pc.unique(table[S.PARTITION]).to_pylist():
        mask = pc.is_null(table[S.PARTITION]) if value is None else pc.equal(table[S.PARTITION], value)
        stats = of_table(table.filter(mask))
        totals[value] = totals[value] + stats if value in totals else stats


def one_or_all(signatures: list[dict]) -> dict | list[dict] | None:
    """The run's signature; a list when shards were scored under different ones (mixed devices)."""
    if not signatures:
        return None
    return signatures[0] if len(signatures) == 1 else signatures
