"""Parquet input: planned from its metadata (a damaged file, or a text column that holds no strings, is
refused before any work) and read by row range, only the row groups that hold a shard's rows.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from ...config import InputSpec
from ..inputs import InputError, InputFile
from ..storage import error_reason, filesystem, is_transient
from .base import Shard, ShardCutter, named_columns, require_columns, row_shards, table_rows


def parquet_file(f: InputFile):
    import pyarrow.parquet as pq

    fs, path = filesystem(f.path)
    if fs is None:
        raise InputError(f"{f.path}: Parquet needs random access; use a local path or an s3://, gs:// or file:// URI")
    try:
        return pq.ParquetFile(fs.open_input_file(path))
    except (pa.ArrowInvalid, OSError) as exc:
        if is_transient(exc):  # an outage, not a damaged file: read again
            raise
        reason = error_reason(exc)
        raise InputError(f"{f.path}: not a readable Parquet file ({reason}); check it or copy it again") from exc


def parquet_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    parquet = parquet_file(f)
    schema = parquet.schema_arrow
    require_columns(f, spec, schema.names)
    text_type = schema.field(spec.text_column).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise InputError(f"{f.path}: text column {spec.text_column!r} holds {text_type}, not strings")
    n_rows = parquet.metadata.num_rows
    if spec.cost is None:
        return row_shards(f, n_rows, spec.shard_rows)
    cutter = ShardCutter(spec)
    return cutter.cut(f, _cost_starts(parquet, spec, cutter), n_rows)


def _cost_starts(parquet, spec: InputSpec, cutter: ShardCutter) -> list[int]:
    """The first row of every shard `cutter` cuts by the texts' sizes, reading the text column one row group
    at a time."""
    import pyarrow.compute as pc

    starts, row = [], 0
    for g in range(parquet.metadata.num_row_groups):
        texts = parquet.read_row_group(g, columns=[spec.text_column])[spec.text_column]
        for n_bytes in pc.fill_null(pc.binary_length(texts), 0).to_pylist():
            if cutter.begins(n_bytes):
                starts.append(row)
            row += 1
    return starts


def parquet_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    try:
        parquet = parquet_file(shard.file)
        columns = named_columns(spec) + [c for c in spec.extra_columns if c in parquet.schema_arrow.names]
        table = read_row_range(parquet, columns, shard.start, shard.rows)
    except (pa.ArrowInvalid, OSError) as exc:
        if is_transient(exc):
            raise
        raise InputError(
            f"{shard.file.path}: rows {shard.start + 1}-{shard.start + shard.rows} cannot be read "
            f"({error_reason(exc)}); the file is damaged: check it or copy it again"
        ) from exc
    yield from table_rows(table, shard, spec)


def read_row_range(parquet, columns: list[str], start: int, rows: int) -> pa.Table:
    """Rows [start, start + rows), reading only the row groups that hold them."""
    groups, first_row, row = [], None, 0
    for g in range(parquet.metadata.num_row_groups):
        n = parquet.metadata.row_group(g).num_rows
        if row + n > start and row < start + rows:
            groups.append(g)
            first_row = row if first_row is None else first_row
        row += n
    table = parquet.read_row_groups(groups, columns=columns)
    return table.slice(start - (first_row or 0), rows)
