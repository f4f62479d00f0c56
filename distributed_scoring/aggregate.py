"""Driver-side aggregation over the written Parquet files: the no-loss check and `summary.json`.

Reads only four small columns, one file at a time, so memory stays flat however large the corpus.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import schema as S
from .config import RunConfig
from .errors import DataLossError
from .output import SUMMARY_FILE, OutputDir
from .sources import Shard
from .stats import STAT_COLUMNS, CorpusStats



def check_complete(out: OutputDir, plan: list[Shard], rows_per_input: int = 1) -> list[dict]:
    """Every planned shard marked done and holding exactly its rows (rows in x `rows_per_input` ==
    rows out), from the markers and the files' metadata alone; returns the scorers' distinct signatures."""
    problems = []
    signatures: dict[str, dict] = {}
    for shard in plan:
        marker = out.read_marker(shard.key)
        if marker is None:
            problems.append(f"shard {shard.key} ({shard.file.path}, rows {shard.start + 1}-{shard.start + shard.rows}) is not done")
            continue
        signatures[repr(sorted(marker["signature"].items()))] = marker["signature"]
        rows = pq.read_metadata(out.part_path(shard.key), filesystem=out.fs).num_rows
        if rows != shard.rows * rows_per_input:
            problems.append(f"shard {shard.key} has {rows} rows, expected {shard.rows * rows_per_input}")
    if problems:
        raise DataLossError(
            f"{sum(s.rows for s in plan)} rows in, fewer out: " + "; ".join(problems[:5])
            + (" ..." if len(problems) > 5 else "") + ". Rerun the same command to score the unfinished shards."
        )
    return list(signatures.values())


def summarize(out: OutputDir, plan: list[Shard], config: RunConfig) -> dict:
    """Check that every planned row was written exactly once, sum the statistics, write summary.json."""
    signatures = check_complete(out, plan)
    stats = CorpusStats()
    by_input: dict[str, CorpusStats] = {}
    by_partition: dict[str | None, CorpusStats] = {}
    columns = STAT_COLUMNS + ([S.PARTITION] if config.inputs.partitioned else [])
    for shard in plan:
        part = pq.ParquetFile(out.part_path(shard.key), filesystem=out.fs)
        for batch in part.iter_batches(columns=columns):
            batch_stats = CorpusStats.of_table(batch)
            stats += batch_stats
            by_input[shard.file.name] = by_input.get(shard.file.name, CorpusStats()) + batch_stats
            if config.inputs.partitioned:
                _add_by_partition(by_partition, pa.Table.from_batches([batch]))
    expected = sum(s.rows for s in plan)
    if stats.rows != expected:
        raise DataLossError(f"{expected} rows in, {stats.rows} rows out; rerun the same command")
    summary = {
        **stats.to_dict(),
        "rows_expected": expected,
        "model": config.model.name,
        "variant": config.scoring.variant,
        "inputs": list(config.inputs.paths),
        "shards": len(plan),
        "signature": _one_or_all(signatures),
        "by_input": {name: s.to_dict() for name, s in by_input.items()},
    }
    if config.inputs.partitioned:
        summary["by_partition"] = {str(name): s.to_dict() for name, s in sorted(by_partition.items(), key=str)}
    out.write_json(SUMMARY_FILE, summary)
    return summary


def _add_by_partition(totals: dict[str | None, CorpusStats], table: pa.Table) -> None:
    """Add a batch's statistics per partition value (a row without a value counts under None)."""
    for value in pc.unique(table[S.PARTITION]).to_pylist():
        mask = pc.is_null(table[S.PARTITION]) if value is None else pc.equal(table[S.PARTITION], value)
        totals[value] = totals.get(value, CorpusStats()) + CorpusStats.of_table(table.filter(mask))


def _one_or_all(signatures: list[dict]) -> dict | list[dict] | None:
    """The run's signature; a list when shards were scored under different ones (mixed devices)."""
    if not signatures:
        return None
    return signatures[0] if len(signatures) == 1 else signatures
