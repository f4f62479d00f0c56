"""The read stage: find the input files, cut them into shards, and read a shard into rows.

A shard is a fixed range of rows of one file. Shards are planned once, on the driver, and their keys
name the output files, so a rerun finds exactly which shards are done. Every input line or record
becomes one row (`schema.READ_SCHEMA`), bad ones included, so that line numbers in ids stay true.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from . import schema as S
from .config import InputSpec
from .errors import UserError

logger = logging.getLogger(__name__)

FORMATS = ("text", "jsonl", "parquet")
_SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


class InputError(UserError):
    """The input cannot be read as asked (missing file, unknown column, ...); the message says how to fix it."""


@dataclass(frozen=True)
class InputFile:
    index: int  # position in the sorted list of inputs: part of every shard key
    path: str
    name: str  # the file's name as used in row ids
    fmt: str


@dataclass(frozen=True)
class Shard:
    """Rows [start, start + rows) of one input file."""

    file: InputFile
    start: int
    rows: int
    byte_offset: int | None = None  # where row `start` begins, for line formats

    @property
    def key(self) -> str:
        return f"{self.file.index:05d}-{self.start:012d}"


def detect_format(path: str) -> str:
    """By suffix: .jsonl/.ndjson, .parquet; anything else is text with one sentence per line."""
    return _SUFFIX_FORMATS.get(Path(path).suffix.lower(), "text")


def resolve_inputs(paths: tuple[str, ...]) -> list[InputFile]:
    """Check the inputs exist and give each a stable name; two inputs may not share a name."""
    files = []
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"input {path!r} does not exist or is not a file")
        files.append(InputFile(index=len(files), path=path, name=Path(path).name, fmt=detect_format(path)))
    seen: dict[str, str] = {}
    for f in files:
        if f.name in seen:
            raise InputError(
                f"inputs {seen[f.name]!r} and {f.path!r} share the name {f.name!r}, so their row ids "
                "would collide; rename one, or give an --id-column"
            )
        seen[f.name] = f.path
    return files


def plan_shards(spec: InputSpec) -> list[Shard]:
    """Every shard of every input, in order; checks the columns up front."""
    shards: list[Shard] = []
    for f in resolve_inputs(spec.paths):
        if f.fmt == "parquet":
            shards += _parquet_shards(f, spec)
        else:
            if f.fmt == "jsonl":
                _check_jsonl_columns(f, spec)
            shards += _line_shards(f, spec.shard_rows)
    return shards


def read_shard(shard: Shard, spec: InputSpec) -> pa.Table:
    """The shard's rows as `schema.READ_SCHEMA`."""
    if shard.file.fmt == "parquet":
        rows = list(_parquet_rows(shard, spec))
    else:
        parse = _text_row if shard.file.fmt == "text" else _jsonl_row
        rows = [parse(raw, f"{shard.file.name}:{number}", spec) for number, raw in _lines(shard)]
    return pa.Table.from_pylist(rows, schema=S.READ_SCHEMA)


def ok_row(row_id: str, text: object) -> dict:
    """A row to score, or an error row when the text is missing or not a string."""
    if text is None:
        return error_row(row_id, None, "text is missing (null)")
    if not isinstance(text, str):
        return error_row(row_id, None, f"text is a {type(text).__name__}, not a string")
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_OK, S.ERROR: None}


def error_row(row_id: str, text: str | None, error: str) -> dict:
    return {S.ID: row_id, S.TEXT: text, S.STATUS: S.STATUS_ERROR, S.ERROR: error}


# Line formats: text (one sentence per line) and JSONL (one object per line).


def _line_shards(f: InputFile, shard_rows: int) -> list[Shard]:
    """Count the lines and note the byte offset of every shard's first line."""
    offsets: list[int] = []
    n_lines = 0
    position = 0
    with open(f.path, "rb") as handle:
        for line in handle:
            if n_lines % shard_rows == 0:
                offsets.append(position)
            n_lines += 1
            position += len(line)
    return [
        Shard(f, start, min(shard_rows, n_lines - start), offset)
        for start, offset in zip(range(0, n_lines, shard_rows), offsets)
    ]


def _lines(shard: Shard) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line without its line ending) for the shard's lines."""
    with open(shard.file.path, "rb") as handle:
        handle.seek(shard.byte_offset or 0)
        for i in range(shard.rows):
            raw = handle.readline()
            number = shard.start + i + 1
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # UTF-8 byte-order mark
            yield number, raw.rstrip(b"\n").removesuffix(b"\r")


def _decode(raw: bytes) -> tuple[str, str | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", "replace"), f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})"


def _text_row(raw: bytes, row_id: str, spec: InputSpec) -> dict:
    text, error = _decode(raw)
    return error_row(row_id, text, error) if error else ok_row(row_id, text)


def _jsonl_row(raw: bytes, row_id: str, spec: InputSpec) -> dict:
    line, error = _decode(raw)
    if error:
        return error_row(row_id, line, error)
    if not line.strip():
        return error_row(row_id, None, "empty line")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return error_row(row_id, line, f"invalid JSON: {exc}")
    if not isinstance(record, dict):
        return error_row(row_id, line, f"a JSON {type(record).__name__}, not an object")
    if spec.id_column is not None:
        if record.get(spec.id_column) is None:
            return error_row(row_id, None, f"record has no {spec.id_column!r} value for its id")
        row_id = str(record[spec.id_column])
    if spec.text_column not in record:
        return error_row(row_id, None, f"record has no {spec.text_column!r} field")
    return ok_row(row_id, record[spec.text_column])


def _check_jsonl_columns(f: InputFile, spec: InputSpec) -> None:
    """Fail early when the first record lacks the text (or id) column: every row would be an error."""
    with open(f.path, "rb") as handle:
        for raw in handle:
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict):
                _require_columns(f, spec, list(record))
                return


def _require_columns(f: InputFile, spec: InputSpec, columns: list[str]) -> None:
    for role, column in (("text", spec.text_column), ("id", spec.id_column)):
        if column is not None and column not in columns:
            raise InputError(
                f"{f.path}: no {role} column {column!r}; its columns are {', '.join(map(repr, columns))}. "
                f"Pass --{role}-column with one of them."
            )


# Parquet.


def _parquet_shards(f: InputFile, spec: InputSpec) -> list[Shard]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(f.path)
    schema = parquet.schema_arrow
    _require_columns(f, spec, schema.names)
    text_type = schema.field(spec.text_column).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        raise InputError(f"{f.path}: text column {spec.text_column!r} holds {text_type}, not strings")
    n_rows = parquet.metadata.num_rows
    return [Shard(f, start, min(spec.shard_rows, n_rows - start)) for start in range(0, n_rows, spec.shard_rows)]


def _parquet_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    import pyarrow.parquet as pq

    columns = [spec.text_column] + ([spec.id_column] if spec.id_column else [])
    table = _read_row_range(pq.ParquetFile(shard.file.path), columns, shard.start, shard.rows)
    texts = table[spec.text_column].to_pylist()
    ids = table[spec.id_column].to_pylist() if spec.id_column else [None] * len(texts)
    for i, (text, given_id) in enumerate(zip(texts, ids)):
        row_id = f"{shard.file.name}:{shard.start + i + 1}"
        if spec.id_column is not None:
            if given_id is None:
                yield error_row(row_id, None, f"row has no {spec.id_column!r} value for its id")
                continue
            row_id = str(given_id)
        yield ok_row(row_id, text)


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
