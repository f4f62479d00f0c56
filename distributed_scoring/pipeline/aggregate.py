"""Driver-side aggregation over the written shards: the no-loss check and `summary.json`.

Both come from the shards' markers, which record each shard's rows and the figures the summary adds up
(`io.output.row_sums`), checked against the files by one look at the folder (`OutputDir.check_shards`): no
shard is read again on a store that lists the files' checksums. A shard whose marker records no figures
(written by an earlier dscore) is read, a few small columns of one file at a time, so memory stays flat
however large the corpus.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Callable, Iterable, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..config import RunConfig
from ..errors import DataLossError
from ..io import schema as S
from ..io.output import MOSTLY_UNKNOWN, ROW_SUMS, SUMMARY_FILE, OutputDir, row_sums
from ..io.output import unknown_tokens as unknown_tokens  # for the workflows that summarise their own rows
from ..io.sources import Shard
from .stats import STAT_COLUMNS, CorpusStats

logger = logging.getLogger(__name__)

Stats = TypeVar("Stats")  # a summable record of rows' figures (`a + b`), as `CorpusStats`

SUMMARY_VERSION = 1  # of summary.json
UNKNOWN_ROWS_WARNING = 0.1  # summary.json warns when more than this share of ok rows are mostly unknown


def complete_markers(out: OutputDir, plan: list[Shard], rows_per_input: int = 1) -> dict[str, dict]:
    """Every planned shard marked done and holding exactly its rows (rows in x `rows_per_input` == rows
    out), from one check of the markers against their files (`OutputDir.check_shards`); returns the planned
    shards' markers, which the folder then keeps in its index for a rerun or `dscore verify`."""
    check = out.check_shards()
    out.warn_unmarked(set(check.files) - {out.part_path(key) for key in (*check.markers, *check.problems)})
    problems = []
    for shard in plan:
        marker = check.markers.get(shard.key)
        if marker is None:
            why = check.problems.get(shard.key)
            problems.append(
                f"shard {shard.key} ({shard.file.path}, rows {shard.start + 1}-{shard.start + shard.rows}) is not done"
                + (f" ({why})" if why else "")
            )
        elif marker["rows"] != shard.rows * rows_per_input:
            problems.append(f"shard {shard.key} has {marker['rows']} rows, expected {shard.rows * rows_per_input}")
    if problems:
        raise DataLossError(
            f"{sum(s.rows for s in plan)} rows in, fewer out: "
            + "; ".join(problems[:5])
            + (" ..." if len(problems) > 5 else "")
            + ". Rerun the same command to score the unfinished shards."
        )
    out.keep_index(check, [s.key for s in plan])
    return {s.key: check.markers[s.key] for s in plan}


def check_complete(out: OutputDir, plan: list[Shard], rows_per_input: int = 1) -> list[dict]:
    """`complete_markers`; returns the scorers' distinct signatures."""
    return signatures(complete_markers(out, plan, rows_per_input).values())


def signatures(markers: Iterable[dict]) -> list[dict]:
    """The distinct signatures of the scorers that wrote the shards of `markers`."""
    distinct = {repr(sorted(m["signature"].items())): m["signature"] for m in markers}
    return list(distinct.values())


def summarize(out: OutputDir, plan: list[Shard], config: RunConfig) -> dict:
    """Check that every planned row was written exactly once, sum the statistics, write summary.json: the
    steps `runner.run` takes for `dscore score`, in one call for a caller that times them apart."""
    summary = corpus_summary(out, plan, config, complete_markers(out, plan))
    out.write_json(SUMMARY_FILE, summary)
    return summary


def corpus_summary(out: OutputDir, plan: list[Shard], config: RunConfig, markers: dict[str, dict]) -> dict:
    """summary.json's content for PLL rows: the statistics summed from the planned shards' checked `markers`
    (`complete_markers`), per input and partition, with what was scored and the warnings."""
    stats = CorpusStats()
    by_input: dict[str, CorpusStats] = {}
    by_partition: dict[str | None, CorpusStats] = {}
    n_unknown, mostly_unknown, windowed = 0, 0, 0
    for shard in plan:
        groups = markers[shard.key].get(ROW_SUMS)
        for group in groups if groups is not None else _read_sums(out, shard.key):
            n_unknown, mostly_unknown = n_unknown + group["n_unknown"], mostly_unknown + group["mostly_unknown"]
            windowed += group.get("windowed", 0)  # markers written before windows record none
            shard_stats = _stats(group)
            stats += shard_stats
            by_input[shard.file.name] = by_input.get(shard.file.name, CorpusStats()) + shard_stats
            if config.inputs.partitioned:
                value = group.get("partition")
                by_partition[value] = by_partition.get(value, CorpusStats()) + shard_stats
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
        signature=one_or_all(signatures(markers.values())),
        by_input=by_input,
        n_unknown=n_unknown,
        mostly_unknown_rows=mostly_unknown,
        warnings=unknown_warnings(mostly_unknown, stats.ok),
        windowed_rows=windowed if config.scoring.long_texts == "window" else None,
        by_partition={str(name): s for name, s in sorted(by_partition.items(), key=str)}
        if config.inputs.partitioned
        else None,
    )
    for warning in summary.warnings:
        logger.warning(warning)
    if windowed:
        logger.info(windowed_line(windowed, stats.ok))
    return summary.to_json()


def windowed_line(windowed: int, ok: int) -> str:
    """What a run says of its rows scored in windows: how many, and what they cost."""
    rows, verb = "row" if ok == 1 else "rows", "was" if windowed == 1 else "were"
    return (
        f"{windowed:,} of {ok:,} scored {rows} {verb} longer than the model's maximum and scored in windows "
        "(--long-texts window): a text of n tokens costs n masked copies of the model's full width instead of "
        "n + 2 tokens, so such rows cost more per token than the others (summary.json: windowed_rows; "
        'docs/score.md, "Long texts")'
    )


def _read_sums(out: OutputDir, key: str) -> list[dict]:
    """The figures of a shard whose marker records none (an earlier dscore wrote it): a few columns of its file read."""
    part = pq.ParquetFile(out.part_path(key), filesystem=out.fs)
    names = part.schema_arrow.names
    sums = row_sums(part.read(columns=[c for c in (*STAT_COLUMNS, S.N_UNKNOWN, S.WINDOWED, S.PARTITION) if c in names]))
    assert sums is not None, f"shard {key} holds no PLL"  # summarize is the PLL workloads'
    return sums


@dataclass(frozen=True)
class Summary:
    """summary.json: the corpus statistics (flattened into the top level on disk), what was scored, per
    input (and per partition when partitioned, else the key is absent), unknown tokens, warnings, and the ok
    rows scored in windows (`windowed_rows`, absent with `--long-texts error`)."""

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
    windowed_rows: int | None = None

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
        if self.windowed_rows is not None:
            data["windowed_rows"] = self.windowed_rows
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
            data.get("windowed_rows"),
        )


def _stats(data: dict) -> CorpusStats:
    """The summable fields of a `CorpusStats.to_dict` object (its PPPLs are derived)."""
    return CorpusStats(**{f.name: data[f.name] for f in fields(CorpusStats)})


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
