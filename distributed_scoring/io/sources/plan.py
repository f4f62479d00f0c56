"""The read stage's plan: cut the input files into shards, and read shards into rows.

A shard is a fixed range of records of one file, planned once on the driver; its key names its output
file, so a rerun finds exactly which shards are done. Every input record becomes one row
(`schema.read_schema`), bad ones included, so that record numbers in ids stay true. Each format's
reader plans its files and reads their shards (`lines`, `parquet`, `hf`); this module picks the reader.
"""

from __future__ import annotations

from itertools import groupby
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ...config import InputSpec
from .. import schema as S
from ..inputs import InputError, find_inputs
from ..storage import Backoff
from .base import Shard, rows_table
from .hf import hf_plan, hf_rows
from .lines import LINE_FORMATS, line_plan, read_line_unit
from .parquet import parquet_file, parquet_plan, parquet_rows, read_row_range


def plan_shards(spec: InputSpec) -> list[Shard]:
    """Every shard of every input, in order; checks the text and id columns up front."""
    shards: list[Shard] = []
    for f in find_inputs(spec.paths):
        if spec.partition_column is not None and f.fmt == "text":
            raise InputError(f"{f.path}: a text file has no columns to partition by; use --partition-by-file")
        if f.fmt == "parquet":
            shards += parquet_plan(f, spec)
        elif f.fmt == "hf":
            shards += hf_plan(f, spec)
        else:
            shards += line_plan(f, spec)
    return shards


def read_units(shards: list[Shard]) -> list[list[Shard]]:
    """Groups of shards read in one pass: each seekable shard alone, a file that cannot seek whole."""
    units: list[list[Shard]] = []
    for _, group in groupby(shards, key=lambda s: s.file.index):
        group = list(group)
        if group[0].file.fmt in LINE_FORMATS and group[0].byte_offset is None:
            units.append(group)
        else:
            units += [[s] for s in group]
    return units


def read_unit(unit: list[Shard], spec: InputSpec) -> Iterator[tuple[Shard, pa.Table]]:
    """Each shard of the unit with its rows as `schema.read_schema`, in order. A read cut by a transient
    storage error (an object store's outage) starts again from the unit's start, the shards already given
    skipped, for as long as `storage.Backoff` allows."""
    given = 0
    backoff = Backoff(f"reading {unit[0].file.path}")
    while True:
        try:
            for i, (shard, rows) in enumerate(_read_unit_once(unit, spec)):
                if i >= given:
                    given += 1
                    yield shard, rows
            return
        except OSError as exc:
            backoff.wait(exc)


def _read_unit_once(unit: list[Shard], spec: InputSpec) -> Iterator[tuple[Shard, pa.Table]]:
    f = unit[0].file
    if f.fmt == "parquet":
        yield unit[0], rows_table(parquet_rows(unit[0], spec), f, spec)
    elif f.fmt == "hf":
        yield unit[0], rows_table(hf_rows(unit[0], spec), f, spec)
    else:
        yield from read_line_unit(unit, spec)


def shard_ids(unit: list[Shard], spec: InputSpec) -> Iterator[tuple[Shard, pa.Array]]:
    """Each shard of the unit with its rows' ids, exactly as `read_unit` makes them (`io.ids` checks them).
    A Parquet file's string or integer ids are read alone, without the texts: a value's string, or the
    made id where it is null."""
    if unit[0].file.fmt == "parquet" and spec.id_column is not None:
        parquet = parquet_file(unit[0].file)
        kind = parquet.schema_arrow.field(spec.id_column).type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind):
            shard = unit[0]
            ids = read_row_range(parquet, [spec.id_column], shard.start, shard.rows)[spec.id_column]
            yield shard, _made_where_null(ids.combine_chunks().cast(pa.string()), shard)
            return
    for shard, rows in read_unit(unit, spec):
        yield shard, rows[S.ID].combine_chunks()


def _made_where_null(ids: pa.Array, shard: Shard) -> pa.Array:
    """`ids` with the made id (`<file>:<record>`) of each record that has none, as `base._record_row` makes them."""
    if not ids.null_count:
        return ids
    numbers = pa.array(range(shard.start + 1, shard.start + shard.rows + 1)).cast(pa.string())
    return pc.if_else(pc.is_null(ids), pc.binary_join_element_wise(f"{shard.file.name}:", numbers, ""), ids)
