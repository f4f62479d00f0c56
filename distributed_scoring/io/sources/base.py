"""What every reader shares: the `Shard` (a fixed range of records of one input file), the row a
record becomes (`schema.read_schema`: an ok row, or an error row that keeps its place), the checks
of the named columns, and the row-index shards of the formats read by row (Parquet, datasets).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import pyarrow as pa

from ...config import InputSpec
from .. import schema as S
from ..inputs import InputError, InputFile


@dataclass(frozen=True)
class Shard:
    """Records [start, start + rows) of one input file."""

    file: InputFile
    start: int
    rows: int
    byte_offset: int | None = None  # where record `start` begins, when the file can seek
    work: float | None = None  # its rows' estimated FLOPs, when cut by work (`config.ShardCost`)

    @property
    def key(self) -> str:
        return f"{self.file.index:05d}-{self.start:012d}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Shard":
        d = json.loads(text)
        return cls(**{**d, "file": InputFile(**{**d["file"], "columns": tuple(d["file"]["columns"])})})


def ok_row(row_id: str, text: object) -> dict:
    """A row to score, or an error row when the text is missing or not a string."""
    if text is None:
        return error_row(row_id, None, "text is missing (null)")
    if not isinstance(text, str):
        return error_row(row_id, None, f"text is a {type(text).__name__}, not a string")
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_OK, S.ERROR: None}


def error_row(row_id: str, text: str | None, error: str) -> dict:
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_ERROR, S.ERROR: error}


def rows_table(rows: Iterator[dict], f: InputFile, spec: InputSpec) -> pa.Table:
    """The rows as a table; with partitioning on, a `partition` column (a record's own value, else
    the file's name when partitioning by file)."""
    rows = list(rows)
    if spec.partition_by_file:
        for row in rows:
            row[S.PARTITION] = f.name
    return pa.Table.from_pylist(
        rows, schema=S.read_schema(spec.partitioned, spec.extra_columns, spec.allow_duplicate_ids)
    )


def placed(row: dict, made_id: str, spec: InputSpec) -> dict:
    """The row with its `line` (its made id: where it was read) when ids may repeat."""
    if spec.allow_duplicate_ids:
        row[S.LINE] = made_id
    return row


def require_columns(f: InputFile, spec: InputSpec, columns: list[str]) -> None:
    roles = (("text", spec.text_column), ("id", spec.id_column), ("partition", spec.partition_column))
    for role, column in roles:
        if column is not None and column not in columns:
            raise InputError(
                f"{f.path}: no {role} column {column!r}; its columns are {', '.join(map(repr, columns))}. "
                f"Pass --{role}-column with one of them."
            )


def id_and_text(record: dict, row_id: str, spec: InputSpec) -> dict:
    """The row of a record with named fields (JSONL, CSV, TSV, Parquet, datasets)."""
    row = _record_row(record, row_id, spec)
    if spec.partition_column is not None and record.get(spec.partition_column) is not None:
        row[S.PARTITION] = str(record[spec.partition_column])
    for column in spec.extra_columns:
        if record.get(column) is not None:
            row[column] = _as_text(record[column])
    return row


def _as_text(value: Any) -> str:
    """An extra column's value as a string: lists (a JSON array of tokens) joined by spaces."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _record_row(record: dict, row_id: str, spec: InputSpec) -> dict:
    if spec.id_column is not None:
        if record.get(spec.id_column) is None:
            return error_row(row_id, None, f"record has no {spec.id_column!r} value for its id")
        row_id = str(record[spec.id_column])
    if spec.text_column not in record:
        return error_row(row_id, None, f"record has no {spec.text_column!r} field")
    return ok_row(row_id, record[spec.text_column])


class ShardCutter:
    """Where shards begin, told one record at a time: every `shard_rows` records, or with a `cost`
    (`config.ShardCost`) also before the record that would take the shard's estimated work past its budget."""

    def __init__(self, spec: InputSpec) -> None:
        self._rows, self._cost = spec.shard_rows, spec.cost
        self._held = 0  # records in the last shard
        self.works: list[float] = []  # each shard's estimated work so far, the last one's still growing

    def begins(self, n_bytes: int) -> bool:
        """Whether a record of `n_bytes` (0 for one that is an error row, which costs no scoring) begins a shard."""
        work = self._cost.record_flops(n_bytes) if self._cost is not None and n_bytes else 0.0
        new = (
            self._held == 0  # the first record (no shard yet)
            or self._held >= self._rows
            or (self._cost is not None and self.works[-1] + work > self._cost.flops_per_shard)
        )
        if new:
            self._held = 0
            self.works.append(0.0)
        self._held += 1
        self.works[-1] += work
        return new

    def cut(
        self, f: InputFile, starts: list[int], n_records: int, offsets: list[int | None] | None = None
    ) -> list[Shard]:
        """The shards beginning at records `starts` (`cut_shards`), each with its estimated work when cut by it."""
        shards = cut_shards(f, starts, n_records, offsets)
        return [replace(s, work=w) for s, w in zip(shards, self.works)] if self._cost is not None else shards


def cut_shards(f: InputFile, starts: list[int], n_records: int, offsets: list[int | None] | None = None) -> list[Shard]:
    """The shards beginning at records `starts` (ascending, the first 0), each up to the next; `offsets`: where
    each begins in the file, for a file that can seek."""
    ends = [*starts[1:], n_records]
    where = offsets if offsets is not None else [None] * len(starts)
    return [Shard(f, start, end - start, offset) for start, end, offset in zip(starts, ends, where)]


def row_shards(f: InputFile, n_rows: int, shard_rows: int) -> list[Shard]:
    """Shards of a file read by row index (Parquet, datasets) every `shard_rows` rows: no byte offsets."""
    return cut_shards(f, list(range(0, n_rows, shard_rows)), n_rows)


def named_columns(spec: InputSpec) -> list[str]:
    return [c for c in (spec.text_column, spec.id_column, spec.partition_column) if c is not None]


def table_rows(table: pa.Table, shard: Shard, spec: InputSpec) -> Iterator[dict]:
    for i, record in enumerate(table.to_pylist()):
        made_id = f"{shard.file.name}:{shard.start + i + 1}"
        yield placed(id_and_text(record, made_id, spec), made_id, spec)
