"""The read stage: cut the input files into shards, and read shards into rows.

A shard is a fixed range of records of one file, planned once on the driver; its key names its output
file, so a rerun finds exactly which shards are done. Every input record becomes one row
(`schema.read_schema`), bad ones included, so that record numbers in ids stay true.

Line formats (text, JSONL, CSV, TSV) are planned by one pass that notes the byte offset of every
shard's first record, so an uncompressed shard is read by seeking. A compressed or stream-only file
cannot seek: its shards are read together, in one pass, as one read unit.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import asdict, dataclass, replace
from itertools import groupby
from typing import BinaryIO, Iterator

import pyarrow as pa

from . import schema as S
from .config import InputSpec
from .inputs import InputError, InputFile, find_inputs
from .storage import filesystem, is_seekable, open_binary

logger = logging.getLogger(__name__)

LINE_FORMATS = ("text", "jsonl", "csv", "tsv")


@dataclass(frozen=True)
class Shard:
    """Records [start, start + rows) of one input file."""

    file: InputFile
    start: int
    rows: int
    byte_offset: int | None = None  # where record `start` begins, when the file can seek

    @property
    def key(self) -> str:
        return f"{self.file.index:05d}-{self.start:012d}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Shard":
        d = json.loads(text)
        return cls(**{**d, "file": InputFile(**{**d["file"], "columns": tuple(d["file"]["columns"])})})


def plan_shards(spec: InputSpec) -> list[Shard]:
    """Every shard of every input, in order; checks the text and id columns up front."""
    shards: list[Shard] = []
    for f in find_inputs(spec.paths):
        if spec.partition_column is not None and f.fmt == "text":
            raise InputError(f"{f.path}: a text file has no columns to partition by; use --partition-by-file")
        if f.fmt == "parquet":
            shards += _parquet_plan(f, spec)
        elif f.fmt == "hf":
            shards += _hf_plan(f, spec)
        else:
            shards += _line_plan(f, spec)
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
    """Each shard of the unit with its rows as `schema.read_schema`, in order."""
    f = unit[0].file
    if f.fmt == "parquet":
        yield unit[0], _rows_table(_parquet_rows(unit[0], spec), f, spec)
    elif f.fmt == "hf":
        yield unit[0], _rows_table(_hf_rows(unit[0], spec), f, spec)
    else:
        yield from _read_line_unit(unit, spec)


def ok_row(row_id: str, text: object) -> dict:
    """A row to score, or an error row when the text is missing or not a string."""
    if text is None:
        return error_row(row_id, None, "text is missing (null)")
    if not isinstance(text, str):
        return error_row(row_id, None, f"text is a {type(text).__name__}, not a string")
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_OK, S.ERROR: None}


def error_row(row_id: str, text: str | None, error: str) -> dict:
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_ERROR, S.ERROR: error}


def _rows_table(rows: Iterator[dict], f: InputFile, spec: InputSpec) -> pa.Table:
    """The rows as a table; with partitioning on, a `partition` column (a record's own value, else
    the file's name when partitioning by file)."""
    rows = list(rows)
    if spec.partition_by_file:
        for row in rows:
            row[S.PARTITION] = f.name
    return pa.Table.from_pylist(rows, schema=S.read_schema(spec.partitioned))


def _require_columns(f: InputFile, spec: InputSpec, columns: list[str]) -> None:
    roles = (("text", spec.text_column), ("id", spec.id_column), ("partition", spec.partition_column))
    for role, column in roles:
        if column is not None and column not in columns:
            raise InputError(
                f"{f.path}: no {role} column {column!r}; its columns are {', '.join(map(repr, columns))}. "
                f"Pass --{role}-column with one of them."
            )


def _id_and_text(record: dict, row_id: str, spec: InputSpec) -> dict:
    """The row of a record with named fields (JSONL, CSV, TSV, Parquet, datasets)."""
    row = _record_row(record, row_id, spec)
    if spec.partition_column is not None and record.get(spec.partition_column) is not None:
        row[S.PARTITION] = str(record[spec.partition_column])
    return row


def _record_row(record: dict, row_id: str, spec: InputSpec) -> dict:
    if spec.id_column is not None:
        if record.get(spec.id_column) is None:
            return error_row(row_id, None, f"record has no {spec.id_column!r} value for its id")
        row_id = str(record[spec.id_column])
    if spec.text_column not in record:
        return error_row(row_id, None, f"record has no {spec.text_column!r} field")
    return ok_row(row_id, record[spec.text_column])


# Line formats.


def _records(stream: BinaryIO, fmt: str, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(byte offset, raw record without its line ending); a quoted CSV field may span lines."""
    pending, start = b"", offset
    for line in stream:
        offset += len(line)
        pending += line
        if fmt == "csv" and pending.count(b'"') % 2:  # inside a quoted field: the record goes on
            continue
        yield start, pending.rstrip(b"\n").removesuffix(b"\r")
        pending, start = b"", offset
    if pending:
        yield start, pending.rstrip(b"\n").removesuffix(b"\r")


def _decode(raw: bytes, first: bool) -> tuple[str, str | None]:
    if first and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # UTF-8 byte-order mark
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", "replace"), f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})"


def _split_fields(line: str, fmt: str) -> list[str]:
    if fmt == "tsv":
        return line.split("\t")
    return next(csv.reader([line]), [])


def _line_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    """One pass over the file: record count, CSV header, first JSONL object, shard offsets."""
    seekable = is_seekable(f.path)
    offsets: list[int] = []
    n_records = 0
    checked = f.fmt != "jsonl"
    try:
        stream = open_binary(f.path, seekable)
    except OSError as exc:
        raise InputError(f"cannot open input {f.path!r}: {exc}") from exc
    with stream:
        records = _records(stream, f.fmt)
        if f.fmt in ("csv", "tsv"):
            header = next(records, None)
            if header is None:
                raise InputError(f"{f.path}: empty {f.fmt.upper()} file, expected a header row")
            columns = _split_fields(_decode(header[1], True)[0], f.fmt)
            _require_columns(f, spec, columns)
            f = replace(f, columns=tuple(columns))
        for offset, raw in records:
            if not checked:
                checked = _check_jsonl_record(f, spec, raw)
            if n_records % spec.shard_rows == 0:
                offsets.append(offset)
            n_records += 1
    return [
        Shard(f, start, min(spec.shard_rows, n_records - start), offset if seekable else None)
        for start, offset in zip(range(0, n_records, spec.shard_rows), offsets)
    ]


def _check_jsonl_record(f: InputFile, spec: InputSpec, raw: bytes) -> bool:
    """Fail early when the first object lacks the text (or id) column: every row would be an error."""
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    if not isinstance(record, dict):
        return False
    _require_columns(f, spec, list(record))
    return True


def _read_line_unit(unit: list[Shard], spec: InputSpec) -> Iterator[tuple[Shard, pa.Table]]:
    f = unit[0].file
    seekable = unit[0].byte_offset is not None
    with open_binary(f.path, seekable) as stream:
        if seekable:
            stream.seek(unit[0].byte_offset)
            records = _records(stream, f.fmt, unit[0].byte_offset)
            index = unit[0].start
        else:
            records = _records(stream, f.fmt)
            if f.fmt in ("csv", "tsv"):
                next(records)  # the header
            index = 0
        for shard in unit:
            for _ in range(shard.start - index):
                _next_record(records, f)  # records of shards already done
            rows = []
            for number in range(shard.start + 1, shard.start + shard.rows + 1):
                offset, raw = _next_record(records, f)
                rows.append(_parse_record(raw, f, f"{f.name}:{number}", spec, first=offset == 0))
            index = shard.start + shard.rows
            yield shard, _rows_table(iter(rows), f, spec)


def _next_record(records: Iterator[tuple[int, bytes]], f: InputFile) -> tuple[int, bytes]:
    record = next(records, None)
    if record is None:
        raise InputError(f"{f.path} has fewer records than when the run was planned; was it changed?")
    return record


def _parse_record(raw: bytes, f: InputFile, row_id: str, spec: InputSpec, first: bool) -> dict:
    text, error = _decode(raw, first)
    if error:
        return error_row(row_id, text, error)
    if f.fmt == "text":
        return ok_row(row_id, text)
    if not text.strip():
        return error_row(row_id, None, "empty line")
    if f.fmt == "jsonl":
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            return error_row(row_id, text, f"invalid JSON: {exc}")
        if not isinstance(record, dict):
            return error_row(row_id, text, f"a JSON {type(record).__name__}, not an object")
        return _id_and_text(record, row_id, spec)
    fields = _split_fields(text, f.fmt)
    if len(fields) != len(f.columns):
        return error_row(row_id, text, f"record has {len(fields)} fields, the header has {len(f.columns)}")
    return _id_and_text(dict(zip(f.columns, fields)), row_id, spec)


# Parquet.


def _parquet_file(f: InputFile):
    import pyarrow.parquet as pq

    fs, path = filesystem(f.path)
    if fs is None:
        raise InputError(f"{f.path}: Parquet needs random access; use a local path or an s3://, gs:// or file:// URI")
    return pq.ParquetFile(fs.open_input_file(path))


def _parquet_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    parquet = _parquet_file(f)
    schema = parquet.schema_arrow
    _require_columns(f, spec, schema.names)
    text_type = schema.field(spec.text_column).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise InputError(f"{f.path}: text column {spec.text_column!r} holds {text_type}, not strings")
    n_rows = parquet.metadata.num_rows
    return _row_shards(f, n_rows, spec.shard_rows)


def _row_shards(f: InputFile, n_rows: int, shard_rows: int) -> list[Shard]:
    """Shards of a file read by row index (Parquet, datasets): no byte offsets."""
    return [Shard(f, start, min(shard_rows, n_rows - start)) for start in range(0, n_rows, shard_rows)]


def _named_columns(spec: InputSpec) -> list[str]:
    return [c for c in (spec.text_column, spec.id_column, spec.partition_column) if c is not None]


def _parquet_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    columns = _named_columns(spec)
    table = _read_row_range(_parquet_file(shard.file), columns, shard.start, shard.rows)
    yield from _table_rows(table, shard, spec)


def _read_row_range(parquet, columns: list[str], start: int, rows: int) -> pa.Table:
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


def _table_rows(table: pa.Table, shard: Shard, spec: InputSpec) -> Iterator[dict]:
    for i, record in enumerate(table.to_pylist()):
        yield _id_and_text(record, f"{shard.file.name}:{shard.start + i + 1}", spec)


# `datasets` folders (save_to_disk).


def _hf_dataset(f: InputFile):
    from datasets import load_from_disk

    _, path = filesystem(f.path)
    return load_from_disk(path)


def _hf_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    dataset = _hf_dataset(f)
    _require_columns(f, spec, dataset.column_names)
    n_rows = len(dataset)
    return _row_shards(f, n_rows, spec.shard_rows)


def _hf_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    columns = _named_columns(spec)
    dataset = _hf_dataset(shard.file).select_columns(columns).with_format("arrow")
    yield from _table_rows(dataset[shard.start : shard.start + shard.rows], shard, spec)
