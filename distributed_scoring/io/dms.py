"""Deep-mutational-scan tables as ProteinGym writes them, and the variants they name.

A DMS table has one row per variant: `mutant` (substitutions such as `A23G:K45R`, numbered from `--offset`,
1 by default: ProteinGym's positions are 1-based in the target sequence), `mutated_sequence`, and the
measurements `DMS_score` (and `DMS_score_bin`, 1 for a functional variant). ProteinGym's reference file
names the assays: `DMS_id`, `DMS_filename` (the table, in the folder given) and `target_seq` (the wild type).
Tables are CSV, JSONL or Parquet (`.gz` read by suffix), read whole with their columns' own types (a CSV's
`mutant` and `mutated_sequence` as strings), once the checks that can refuse them have read them a block at a
time (`table_columns`, `table_batches`): a table that is refused is never held whole, however large.

A variant that cannot be scored is not an exception: `parse_mutant` returns why, and the row becomes an error
row that says it. Sequences are residue strings; positions here are 0-based.
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import UserError
from .sources.lines import MAX_RECORD_BYTES
from .storage import join, open_binary

MUTANT, MUTATED_SEQUENCE, DMS_SCORE, DMS_SCORE_BIN = "mutant", "mutated_sequence", "DMS_score", "DMS_score_bin"
DMS_ID, DMS_FILENAME, TARGET_SEQ = "DMS_id", "DMS_filename", "target_seq"
UNIPROT_ID, SELECTION_TYPE = "UniProt_ID", "coarse_selection_type"  # ProteinGym's averages group assays by these
# One substitution: wild-type residue, position, mutant residue (`A23G`); a multi-mutant joins them with ':'.
_SUBSTITUTION = re.compile(r"([A-Za-z*])(-?\d+)([A-Za-z*])")
_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
# What the checks' read of a CSV or JSONL table parses at a time; at most `MAX_RECORD_BYTES`, so that only a
# block's last line, completed from the stream, can be over that limit.
_BLOCK_BYTES = 1 << 20


class DMSError(UserError):
    """A table or reference file that cannot be read as one (raised before any work)."""


@dataclass(frozen=True)
class Assay:
    """One assay: its id, its table and its wild type; from a reference file that has them, its protein and the
    kind of its selection (ProteinGym averages its figures by both)."""

    id: str
    table: str
    target_seq: str
    uniprot_id: str | None = None
    selection_type: str | None = None


@dataclass(frozen=True)
class Site:
    """One substitution: 0-based position in the wild type, the residue there and the one put in its place."""

    position: int
    wild: str
    mutant: str


def table_format(uri: str) -> str:
    """csv, jsonl or parquet, from the name (a `.gz` suffix aside)."""
    fmt = _SUFFIXES.get(_suffix(uri))
    if fmt is None:
        raise DMSError(f"{uri}: a DMS table must be .csv, .jsonl or .parquet (optionally .gz), ProteinGym's columns")
    return fmt


def read_table(uri: str) -> pa.Table:
    """The whole table, its columns with the types they were written with (a CSV's inferred by pyarrow from all of
    it, but `mutant` and `mutated_sequence` read as strings, as `table_batches` reads them for the checks)."""
    import pyarrow.csv
    import pyarrow.json
    import pyarrow.parquet as pq

    with _opened(uri) as (fmt, stream):
        if fmt == "csv":
            names = pyarrow.csv.ConvertOptions(column_types={c: pa.string() for c in (MUTANT, MUTATED_SEQUENCE)})
            return pyarrow.csv.read_csv(stream, convert_options=names)
        if fmt == "jsonl":
            return pyarrow.json.read_json(stream)
        return pq.read_table(stream)


def table_columns(uri: str) -> list[str]:
    """The names of the table's columns: a CSV's header, a Parquet file's schema, the fields of a JSONL table's
    first block of lines. Nothing more is read."""
    import pyarrow.parquet as pq

    with _opened(uri) as (fmt, stream):
        if fmt == "parquet":
            return pq.ParquetFile(stream).schema_arrow.names
        return _parsed(fmt, next(_line_blocks(stream, fmt, uri), b""), []).schema.names


def table_batches(uri: str, columns: list[str]) -> Iterator[pa.Table | pa.RecordBatch]:
    """The table's `columns` (which it has) a block at a time: about 1 MiB of whole lines of a CSV or JSONL table,
    each block parsed alone, or a batch of a Parquet row group. A read that fails is a `DMSError`."""
    import pyarrow.parquet as pq

    with _opened(uri) as (fmt, stream):
        if fmt == "parquet":
            yield from pq.ParquetFile(stream).iter_batches(columns=columns)
            return
        for block in _line_blocks(stream, fmt, uri):
            yield _parsed(fmt, block, columns)


def _line_blocks(stream: BinaryIO, fmt: str, uri: str) -> Iterator[bytes]:
    """The stream's lines in blocks of about `_BLOCK_BYTES`, each ending at a line's end (and, for a CSV, after
    its header line, so that each parses alone). A line over `MAX_RECORD_BYTES` is refused, so a block is at
    most the two together, whatever the file. Cut here, not by pyarrow's streaming readers: one of those given
    up before its end (a repeat found), reading a Python stream, can hang or abort the process."""
    header = _whole_lines(stream.readline(MAX_RECORD_BYTES + 1), stream, uri, 0) if fmt == "csv" else b""
    lines = header.count(b"\n")
    empty = True
    while block := stream.read(_BLOCK_BYTES):
        block = _whole_lines(block, stream, uri, lines)
        lines += block.count(b"\n")
        empty = False
        yield header + block
    if header and empty:
        yield header  # a header alone: its columns, no rows


def _whole_lines(block: bytes, stream: BinaryIO, uri: str, lines: int) -> bytes:
    """`block` (after `lines` lines of the stream) and the rest of its last line, refused over `MAX_RECORD_BYTES`."""
    if not block.endswith(b"\n"):
        block += stream.readline(MAX_RECORD_BYTES + 1)
    start = block.rfind(b"\n", 0, len(block) - 1) + 1  # where the last line begins
    if len(block) - start - block.endswith(b"\n") > MAX_RECORD_BYTES:
        number = lines + block.count(b"\n", 0, start) + 1
        raise DMSError(
            f"{uri}: line {number:,} is over {MAX_RECORD_BYTES:,} bytes ({MAX_RECORD_BYTES / 2**20:g} MiB), longer "
            "than any row of a DMS table: check that the file is the table and has line endings"
        )
    return block


def _parsed(fmt: str, block: bytes, columns: list[str]) -> pa.Table:
    """A block of whole lines (a CSV's after its header) as a table: its `columns`, a CSV's as strings (as
    `read_table` reads them), a JSONL block's with the types its values have (null where it has none of one);
    every column, with the types pyarrow infers, when `columns` is empty."""
    import pyarrow.csv
    import pyarrow.json

    if fmt == "csv":
        convert = pyarrow.csv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns})
        read = pyarrow.csv.ReadOptions(use_threads=False)
        return pyarrow.csv.read_csv(pa.BufferReader(block), read_options=read, convert_options=convert)
    read = pyarrow.json.ReadOptions(use_threads=False, block_size=max(len(block), 1))
    table = pyarrow.json.read_json(pa.BufferReader(block), read_options=read)
    if not columns:
        return table
    return pa.table({c: table[c] if c in table.column_names else pa.nulls(table.num_rows) for c in columns})


@contextmanager
def _opened(uri: str) -> Iterator[tuple[str, BinaryIO]]:
    """The table's format and a stream of it; a read that fails, here or while the stream is read, as a `DMSError`
    that names the table."""
    fmt = table_format(uri)
    try:
        with open_binary(uri, seekable=fmt == "parquet") as stream:
            yield fmt, stream
    except (OSError, pa.ArrowInvalid) as exc:
        raise DMSError(
            f"cannot read the DMS table {uri} ({str(exc).splitlines()[0]}): check its path and format"
        ) from exc


def strings_of(table: pa.Table | pa.RecordBatch, column: str) -> list[str | None]:
    """A column as stripped strings, None where empty or missing (a CSV's empty cell, a null)."""
    values = pc.cast(table[column], pa.string()).to_pylist()
    return [(v.strip() or None) if isinstance(v, str) else None for v in values]


def numbers_of(table: pa.Table, column: str) -> list[float | None] | str:
    """A measurement column as floats (None where empty or missing), or why it is not one, naming the values
    that are not numbers: a `DMS_score` of `high` or `n/a` leaves the statistics to be skipped with the reason,
    where a cast would stop the run after its scoring, and again on every rerun."""
    kind = table.schema.field(column).type
    try:
        return pc.cast(table[column], pa.float64()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return f"{column} is not numeric (its type is {kind})"
    values = strings_of(table, column)  # a CSV's empty cell is a missing measurement, not a word
    bad = [v for v in values if v is not None and not _is_number(v)]
    if bad:
        shown = ", ".join(repr(v) for v in list(dict.fromkeys(bad))[:3])
        return f"{column} is not numeric: {len(bad)} of {len(values)} values are not numbers (e.g. {shown})"
    return pc.cast(pa.array(values, pa.string()), pa.float64()).to_pylist()


def _is_number(text: str) -> bool:
    """Whether Arrow reads `text` as a float64, as it reads a numeric column."""
    try:
        pc.cast(pa.scalar(text), pa.float64())
    except pa.ArrowInvalid:
        return False
    return True


def refuse_repeats(mutants: Iterable[str | None], uri: str) -> None:
    """A variant named twice in one table is refused, as a repeated id is: its scores could not be told apart.
    Names are compared as `variant_key` writes them, so `e1q` repeats `E1Q`, and `L5V:E1Q` repeats `E1Q:L5V`.
    `mutants` may be read as it goes (`table_batches`): the first repeat stops the reading, and what is held is a
    key per distinct variant, not the table."""
    seen: dict[str, tuple[int, str]] = {}
    for number, mutant in enumerate(mutants, start=1):
        if mutant is None:
            continue
        key = variant_key(mutant)
        if key in seen:
            row, first = seen[key]
            if first == mutant:
                raise DMSError(
                    f"{uri}: the mutant {mutant!r} appears twice (again on row {number}); each variant must be named "
                    "once"
                )
            raise DMSError(
                f"{uri}: the mutants {first!r} (row {row}) and {mutant!r} (row {number}) name the same variant; each "
                "variant must be named once"
            )
        seen[key] = (number, mutant)


def variant_key(name: str) -> str:
    """One way of writing the variant a `mutant` (or a sequence) names: upper case, its substitutions in the order
    of their positions. Only repeats are found by it; the output keeps each name as the table wrote it."""
    parts = [part.strip().upper() for part in name.split(":")]
    return ":".join(sorted(parts, key=_site_order))


def _site_order(part: str) -> tuple[int, int, str]:
    """A substitution sorts by its position; a part that is none (an error row's) after them, as written."""
    match = _SUBSTITUTION.fullmatch(part)
    return (0, int(match.group(2)), part) if match else (1, 0, part)


def read_reference(uri: str, tables: str) -> list[Assay]:
    """The assays of a ProteinGym reference file, each table found under `tables` (a folder), or, when `tables`
    is one table, the assay whose `DMS_filename` is its name. Only its three columns are read (and `UniProt_ID`
    and `coarse_selection_type` where it has them), a block at a time."""
    columns = table_columns(uri)
    missing = [c for c in (DMS_ID, DMS_FILENAME, TARGET_SEQ) if c not in columns]
    if missing:
        raise DMSError(f"{uri} has no {', '.join(missing)} column(s): pass ProteinGym's reference file")
    groups = [c for c in (UNIPROT_ID, SELECTION_TYPE) if c in columns]
    one_table = _suffix(tables) in _SUFFIXES
    assays, ids = [], Counter()
    for batch in table_batches(uri, [DMS_ID, DMS_FILENAME, TARGET_SEQ, *groups]):
        # upper case, as --target-seq is read; an empty one: the assay's rows are errors
        targets = [(t or "").upper() for t in strings_of(batch, TARGET_SEQ)]
        grouped = [
            strings_of(batch, c) if c in groups else [None] * batch.num_rows for c in (UNIPROT_ID, SELECTION_TYPE)
        ]
        for r, target, uniprot, selection in zip(batch.select([DMS_ID, DMS_FILENAME]).to_pylist(), targets, *grouped):
            ids[str(r[DMS_ID])] += 1
            if not one_table or str(r[DMS_FILENAME]) == file_name(tables):
                table = tables if one_table else join(tables, str(r[DMS_FILENAME]))
                assays.append(Assay(str(r[DMS_ID]), table, target, uniprot, selection))
    repeated = sorted(i for i, n in ids.items() if n > 1)
    if repeated:
        raise DMSError(f"{uri}: the DMS_id(s) {repeated[:3]} appear more than once; each assay must be listed once")
    if not assays:
        raise DMSError(f"{uri} lists no assay whose DMS_filename is {file_name(tables)!r}")
    return assays


def file_name(uri: str) -> str:
    """The last part of a path or URI: a table's file name."""
    return PurePosixPath(uri.split("://", 1)[-1]).name


def _suffix(uri: str) -> str:
    """A table's format suffix, lower case, a `.gz` after it aside."""
    return PurePosixPath(file_name(uri).lower().removesuffix(".gz")).suffix


def parse_mutant(mutant: str, target: str, offset: int = 1) -> list[Site] | str:
    """The substitutions `mutant` names in `target` (positions numbered from `offset`), or why it names none
    that can be scored: a malformed name, a position outside the target, a wild-type residue that is not the
    target's, a site named twice."""
    sites: list[Site] = []
    for part in mutant.split(":"):
        match = _SUBSTITUTION.fullmatch(part.strip())
        if match is None:
            return f"{part!r} is not a substitution such as A23G (an insertion or deletion cannot be scored this way)"
        wild, number, new = match.group(1).upper(), int(match.group(2)), match.group(3).upper()
        i = number - offset
        if not 0 <= i < len(target):
            return (
                f"position {number} of {part!r} is outside the target ({len(target)} residues numbered from {offset})"
            )
        if target[i] != wild:
            return f"{part!r}: residue {number} of the target is {target[i]}, not {wild} (check --offset or the target)"
        if any(s.position == i for s in sites):
            return f"site {number} is mutated twice in {mutant!r}"
        sites.append(Site(i, wild, new))
    return sites


def mutated(target: str, sites: list[Site]) -> str:
    """The target with the substitutions applied."""
    residues = list(target)
    for site in sites:
        residues[site.position] = site.mutant
    return "".join(residues)
