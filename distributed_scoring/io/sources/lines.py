"""The line formats (text, JSONL, CSV, TSV): their records, planning and reading.

Line formats are planned by one pass that notes the byte offset of every shard's first record, so an
uncompressed shard is read by seeking. A compressed or stream-only file cannot seek: its shards are
read together, in one pass, as one read unit.

What planning refuses, before any work, since no per-row answer could keep rows in == records in: a
damaged compressed file, a CSV quoted field that is never closed (it would swallow the rest of the
file), CR-only (old Mac) line endings (the whole file would read as one record), and what is not
UTF-8 text at all: a UTF-16 or UTF-32 file (by its byte-order mark) or a binary file (NUL bytes near its
start), whose "lines" would be garbage, some of it scored as ok.

No line is ever held whole: the stream is read in pieces of at most `MAX_RECORD_BYTES` + 1 bytes, and a record
longer than `MAX_RECORD_BYTES` (a 2 GiB line in a 9 MB `.gz`) is read past, keeping only its length, and becomes an
error row that names the limit. So reading holds about one shard of records of at most the limit, whatever the
file holds.
"""

from __future__ import annotations

import csv
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import BinaryIO, Iterator

import pyarrow as pa

from ...config import InputSpec
from .. import schema as S
from ..inputs import InputError, InputFile
from ..storage import error_reason, is_seekable, is_transient, open_binary
from .base import Shard, ShardCutter, error_row, id_and_text, ok_row, placed, require_columns, rows_table

LINE_FORMATS = ("text", "jsonl", "csv", "tsv")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_BARE_CR = re.compile(rb"\r(?!\n|$)")
_CSV_MARKS = re.compile(rb'[",\n]')
_SNIFFED_BYTES = 8192  # the start of a line-format file that is checked for being text
# The longest record read, in bytes, its line ending aside (docs/runs.md). The longest text a model scores is 100
# windows of its width (`workloads.prepare.WINDOWED_LIMIT`: 51,200 tokens for BERT, some 250 KB of English), so a
# longer record is a file without line endings or not text, and holding it would cost memory without bound.
MAX_RECORD_BYTES = 1 << 20
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)  # longest first: UTF-32 LE starts with UTF-16 LE's mark


class _OpenQuote(Exception):
    """The stream ended inside a quoted CSV field; `line` counts from where the stream was opened."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


@dataclass(frozen=True)
class _Oversized:
    """A record longer than the limit, read past: its length (line ending aside) and its first bytes, which the
    checks of a file's first record read."""

    n_bytes: int
    head: bytes


def _records(
    stream: BinaryIO, fmt: str, offset: int = 0, limit: int = MAX_RECORD_BYTES
) -> Iterator[tuple[int, bytes | _Oversized]]:
    """(byte offset, raw record without its line ending, or `_Oversized` past `limit` bytes); a quoted CSV field may
    span lines. The stream is read in pieces of at most `limit` + 1 bytes and at most `limit` + 2 bytes of a record
    are held, so a line of any length costs bounded memory.

    Raises `_OpenQuote` at the end of the stream when a quoted field is still open.
    """
    pending: list[bytes] = []  # the pieces of the record, joined once it ends; dropped once it is over the limit
    size, tail, head = 0, b"", b""  # the record's bytes so far, its last two (its line ending), its first
    start, lines, open_line = offset, 0, 0
    state = _CSV_RECORD_START
    while piece := stream.readline(limit + 1):
        offset += len(piece)
        if fmt == "csv":
            state = _csv_state(piece, state)
        if not size and piece.endswith(b"\n") and not state.quoted:  # a record in one line, within the limit
            lines += 1
            state = _CSV_RECORD_START
            yield start, piece[:-1].removesuffix(b"\r")
            start = offset
            continue
        if not size:
            open_line = lines + 1
        size += len(piece)
        tail = piece[-2:] if len(piece) > 1 else tail[-1:] + piece
        if size <= limit + 2:  # past it the record is surely over the limit (a line ending is 2 bytes at most)
            pending.append(piece)
        elif pending:
            head, pending = b"".join(pending)[:_SNIFFED_BYTES], []
        if not piece.endswith(b"\n"):  # the line goes on
            continue
        lines += 1
        if state.quoted:  # inside a quoted field: the record goes on
            continue
        state = _CSV_RECORD_START
        yield start, _record(pending, size, tail, head, limit)
        pending, size, tail, head, start = [], 0, b"", b"", offset
    if state.quoted:
        raise _OpenQuote(open_line)
    if size:
        yield start, _record(pending, size, tail, head, limit)


def bounded_lines(stream: BinaryIO, limit: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(1-based number, line without its ending) of each line of `stream`, None for one over `limit` bytes,
    read past: the line readers outside the read stage (N-best lists, references) hold no line whole either."""
    for number, (_, raw) in enumerate(_records(stream, "text", limit=limit), start=1):
        yield number, None if isinstance(raw, _Oversized) else raw


def _record(pending: list[bytes], size: int, tail: bytes, head: bytes, limit: int) -> bytes | _Oversized:
    """The record of `size` bytes ending in `tail`, without its line ending (a LF, a CRLF, or a CR the stream ends
    on), or `_Oversized` when that is over `limit` bytes."""
    bare = tail.removesuffix(b"\n")
    n_bytes = size - (len(tail) - len(bare)) - bare.endswith(b"\r")
    if n_bytes > limit:
        return _Oversized(n_bytes, head or b"".join(pending)[: min(n_bytes, _SNIFFED_BYTES)])
    return b"".join(pending)[:n_bytes]


@dataclass(frozen=True)
class _CsvState:
    """Where a CSV record stands after some of its bytes."""

    quoted: bool  # inside a quoted field
    after_quote: bool  # just after a quote in a quoted field: it closes the field, or a second one follows
    field_start: bool


_CSV_RECORD_START = _CsvState(quoted=False, after_quote=False, field_start=True)


def _csv_state(chunk: bytes, state: _CsvState) -> _CsvState:
    """The state after `chunk`. Only a quote that starts a field opens a quoted one: a quote inside an
    unquoted field (`a"b`) is a literal, as the csv module reads it, and cannot swallow lines. Only
    quotes, commas and newlines are visited, so a planning pass stays fast."""
    if not state.quoted and b'"' not in chunk:
        return _CsvState(False, False, chunk.endswith((b",", b"\n")))
    quoted, after_quote, field_start = state.quoted, state.after_quote, state.field_start
    last = -1
    for mark in _CSV_MARKS.finditer(chunk):
        if mark.start() > last + 1 and not quoted:  # other bytes since the last mark: an unquoted field
            field_start = after_quote = False
        last = mark.start()
        byte = mark.group()
        if quoted:
            quoted = byte != b'"'
            after_quote = not quoted
        elif after_quote and byte == b'"':  # a doubled quote: still inside the field
            quoted, after_quote = True, False
        else:
            quoted = field_start and byte == b'"'
            field_start, after_quote = byte != b'"', False
    if len(chunk) > last + 1 and not quoted:
        field_start = after_quote = False
    return _CsvState(quoted, after_quote, field_start)


def _decode(raw: bytes, first: bool) -> tuple[str, str | None]:
    if first and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # UTF-8 byte-order mark
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", "replace"), f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})"


def _split_fields(line: str, fmt: str) -> list[str]:
    """The fields of a record; raises `csv.Error` for malformed quoting (`"ab"c`)."""
    if fmt == "tsv":
        return line.split("\t")
    return next(csv.reader([line], strict=True), [])


def line_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    """One pass over the file: record count, CSV header, first JSONL object, shard offsets."""
    seekable = is_seekable(f.path)
    try:
        stream = open_binary(f.path, seekable)
    except OSError as exc:
        raise InputError(f"cannot open input {f.path!r}: {exc}") from exc
    with stream, _plain_errors(f, "planning"):
        f, cutter, starts, offsets, n_records = _count_records(f, spec, stream)
    return cutter.cut(f, starts, n_records, offsets if seekable else None)


def _count_records(
    f: InputFile, spec: InputSpec, stream: BinaryIO
) -> tuple[InputFile, ShardCutter, list[int], list[int | None], int]:
    """(the file with its CSV/TSV columns, the cutter that cut it, the first record of every shard and its byte
    offset, record count)."""
    if hasattr(stream, "peek"):  # every reader `open_binary` makes but smart-open's
        _refuse_non_text(f, stream.peek(_SNIFFED_BYTES)[:_SNIFFED_BYTES])
    starts: list[int] = []
    offsets: list[int | None] = []
    cutter = ShardCutter(spec)
    n_records = 0
    checked = f.fmt != "jsonl"
    records = _records(stream, f.fmt)
    if f.fmt in ("csv", "tsv"):
        header = next(records, None)
        if header is None:
            raise InputError(f"{f.path}: empty {f.fmt.upper()} file, expected a header row")
        _refuse_cr_line_endings(f, header[1])
        if isinstance(header[1], _Oversized):
            raise InputError(
                f"{f.path}: the header row is {header[1].n_bytes:,} bytes long, over the limit of "
                f"{MAX_RECORD_BYTES:,} bytes per record; check that the file is {f.fmt.upper()} with line endings"
            )
        try:
            columns = _split_fields(_decode(header[1], True)[0], f.fmt)
        except csv.Error as exc:
            raise InputError(f"{f.path}: the header row is not valid CSV ({exc}); fix its quoting") from exc
        require_columns(f, spec, columns)
        f = replace(f, columns=tuple(columns))
    for offset, raw in records:
        if n_records == 0:
            _refuse_cr_line_endings(f, raw)
        if not checked and isinstance(raw, bytes):  # an oversized first record: its error row says why
            checked = _check_jsonl_record(f, spec, raw)
        if cutter.begins(len(raw) if isinstance(raw, bytes) else 0):
            starts.append(n_records)
            offsets.append(offset)
        n_records += 1
    return f, cutter, starts, offsets, n_records


def _refuse_non_text(f: InputFile, head: bytes) -> None:
    """Refuse a file that is not UTF-8 text, judged by its first bytes (`head`): a UTF-16/32 byte-order
    mark names the encoding to convert from; a NUL byte, which no UTF-8 text holds, means a binary file
    (or wide text without a mark). Either would otherwise be cut into records of garbage at its newline
    bytes (a binary file was once diagnosed as having CR-only line endings)."""
    for mark, encoding in _WIDE_BOMS:
        if head.startswith(mark):
            raise InputError(
                f"{f.path} is {encoding} text (it starts with a {encoding} byte-order mark) and dscore reads UTF-8: "
                f"re-encode it as UTF-8 (e.g. `iconv -f {encoding} -t UTF-8 IN > OUT`) and run again"
            )
    if b"\x00" in head:
        raise InputError(
            f"{f.path} is not a text file: NUL bytes in its first {len(head)} bytes mean binary data (or UTF-16/32 "
            "text without a byte-order mark); pass UTF-8 text, JSONL, CSV or TSV, or Parquet with its .parquet suffix"
        )


def _refuse_cr_line_endings(f: InputFile, first_record: bytes | _Oversized) -> None:
    """Lines ended by a lone CR (old Mac files) would all read as one record, so rows in != records
    in. Only the first record is checked (its first bytes when it is over the limit, as a CR-only file
    longer than the limit is): a file with LF endings rarely starts with a bare CR, and a CR-only file
    always does (when it has two lines or more)."""
    if _BARE_CR.search(first_record.head if isinstance(first_record, _Oversized) else first_record):
        raise InputError(
            f"{f.path}: line 1 holds a carriage return (CR) that ends no CRLF pair: the file seems to use "
            "old Mac (CR-only) line endings, so all of it would read as one record; convert its line endings "
            "to LF (e.g. `tr '\\r' '\\n' < IN > OUT`) and run again"
        )


@contextmanager
def _plain_errors(f: InputFile, stage: str) -> Iterator[None]:
    """A damaged compressed file or a CSV quote never closed, as one line naming the file."""
    try:
        yield
    except _OpenQuote as exc:
        if stage != "planning":
            raise InputError(f"{f.path} now ends inside a quoted field; was it changed since planning?") from None
        raise InputError(
            f"{f.path}: line {exc.line} opens a quoted CSV field that is never closed, so the rest of the file "
            'would read as one field; close the quote, or write a literal quote inside a quoted field as ""'
        ) from None
    except (OSError, EOFError) as exc:
        if isinstance(exc, OSError) and is_transient(exc):  # an outage, not a damaged file: read again
            raise
        raise InputError(
            f"{f.path}: cannot be read while {stage} ({error_reason(exc)}); the file is damaged or truncated, "
            "or its suffix does not match its compression: check it (e.g. `gzip -t`) or copy it again"
        ) from exc


def _check_jsonl_record(f: InputFile, spec: InputSpec, raw: bytes) -> bool:
    """Fail early when the first object lacks the text (or id) column: every row would be an error."""
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # the line's own error row says why
        return False
    if not isinstance(record, dict):
        return False
    require_columns(f, spec, list(record))
    return True


def read_line_unit(unit: list[Shard], spec: InputSpec) -> Iterator[tuple[Shard, pa.Table]]:
    f = unit[0].file
    seekable = unit[0].byte_offset is not None
    with open_binary(f.path, seekable) as stream, _plain_errors(f, "reading"):
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
                made_id = f"{f.name}:{number}"
                rows.append(placed(_parse_record(raw, f, made_id, spec, first=offset == 0), made_id, spec))
            index = shard.start + shard.rows
            yield shard, rows_table(iter(rows), f, spec)


def _next_record(records: Iterator[tuple[int, bytes | _Oversized]], f: InputFile) -> tuple[int, bytes | _Oversized]:
    record = next(records, None)
    if record is None:
        raise InputError(f"{f.path} has fewer records than when the run was planned; was it changed?")
    return record


def _parse_record(raw: bytes | _Oversized, f: InputFile, row_id: str, spec: InputSpec, first: bool) -> dict:
    if isinstance(raw, _Oversized):
        return error_row(
            row_id,
            None,
            f"record is {raw.n_bytes:,} bytes long, over the limit of {MAX_RECORD_BYTES:,} bytes "
            f"({MAX_RECORD_BYTES / 2**20:g} MiB) per record (line): it was read past, not kept; split it into shorter "
            "lines",
        )
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
        except (json.JSONDecodeError, RecursionError) as exc:  # a line nested thousands deep exceeds Python's depth
            return error_row(row_id, text, f"invalid JSON: {exc}")
        if not isinstance(record, dict):
            return error_row(row_id, text, f"a JSON {type(record).__name__}, not an object")
        return without_lone_surrogates(id_and_text(record, row_id, spec), row_id)
    try:
        fields = _split_fields(text, f.fmt)
    except csv.Error as exc:
        return error_row(row_id, text, f"malformed CSV quoting ({exc}); quote the field and double any quote inside it")
    if len(fields) != len(f.columns):
        return error_row(row_id, text, f"record has {len(fields)} fields, the header has {len(f.columns)}")
    return id_and_text(dict(zip(f.columns, fields)), row_id, spec)


def without_lone_surrogates(row: dict, row_id: str) -> dict:
    """The row, or an error row when a JSON escape spelled a lone surrogate (`"\\ud800"`): json.loads
    accepts it, but it is no character and cannot be written as UTF-8, so it would crash the shard."""
    for column in (S.ID, S.TEXT, S.PARTITION):
        value = row.get(column)
        match = _LONE_SURROGATE.search(value) if isinstance(value, str) else None
        if match:
            return error_row(
                row_id if column == S.ID else row[S.ID],
                None,
                f"the {column} holds a lone surrogate escape \\u{ord(match.group()):04x} (at character "
                f"{match.start()}), which is no Unicode character; fix or drop that escape",
            )
    return row
