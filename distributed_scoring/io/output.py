"""The write stage and the output folder: one Parquet file per shard, a completion marker per shard.

Layout: `DIR/rows/part-<shard>.parquet` (the scored rows, readable as one dataset:
`pyarrow.parquet.read_table("DIR/rows")`), `DIR/summary.json`, and the bookkeeping `DIR/_run.json`
and `DIR/_done/<shard>.json`.

A shard's file is written whole before its marker, so a marker always means a complete file: on a local or
shared filesystem under a hidden temporary name (which dataset readers skip) and moved into place, on an
object store in one PUT (whole or not at all; a rename there would be a copy and a delete). Temporary files
left by a killed run are removed when the next run starts. A rerun on the same folder skips marked shards (resume),
and `_run.json` makes sure the folder belongs to the same run (same inputs, model and options); input files
that changed under a resumed run are caught by `provenance.py`. The rows of a run are its marked shards:
a Parquet file in `rows/` without a marker (a copied shard) is no row of it, and every reader here leaves
it out with a warning. `claim.py` takes the folder for a run (lock, admission, --overwrite), `lock.py`
keeps a second run out, and `verify.py` checks a folder.

A marker records what the run's summary adds up (`ROW_SUMS`), so the summary reads no shard again, and the MD5
of its file, which S3 lists as the ETag of an object written in one PUT: a listing then shows a file to be the
bytes its marker describes without a byte of it read. When a run finishes, the markers it checked are kept,
with the ETags they were listed with, in `_done/_index.jsonl`; a rerun or `dscore verify` reads that one file
instead of every marker for as long as a listing shows each marker and file unchanged. Anything else (a marker
or file changed, a store that lists no ETags, a local disk) is read and checked as it always was.
Local paths and object-store URIs (`s3://`, `gs://`, `file://`) go through pyarrow filesystems; S3's
listings (with their ETags) through boto3, which finds the store as pyarrow does (docs/runs.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..config import RunConfig
from ..errors import UserError
from ..options import added_later
from . import schema as S
from .provenance import DIGEST, INPUT_FILES, changed_files
from .sources import Shard
from .storage import boto_errors, filesystem, join, retrying, s3_client, scheme

logger = logging.getLogger(__name__)

ROWS_DIR = "rows"
RUN_FILE = "_run.json"
DONE_DIR = "_done"
SUMMARY_FILE = "summary.json"
# The reports a command writes beside its rows: for programs, for people, and the audit's page.
REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
LOCK_FILE = "_lock.json"
# What `_run.json` records beside the fingerprint, for `dscore verify` and --overwrite (never compared
# between runs, so folders written before a key existed still resume): the planned shards (key -> input
# rows), the rows each input row gives, the columns that key its rows (`id` and those its workload
# declares) and what the run wrote beside its shards (`claim.Claim.record`).
SHARDS = "shards"
ROWS_PER_INPUT = "rows_per_input"
ROW_KEY = "row_key"
OUTPUTS = "outputs"
BOOKKEEPING = (INPUT_FILES, SHARDS, ROWS_PER_INPUT, ROW_KEY, OUTPUTS)
FILE_DIGEST = "file_sha256"  # the key of a shard's marker that holds its Parquet file's digest
FILE_MD5 = "file_md5"  # and its MD5: the ETag S3 lists for an object written in one PUT
ROW_SUMS = "row_sums"  # and what the run's summary adds up of its rows (`row_sums`)
INDEX_FILE = "_index.jsonl"  # in `_done/`: the markers a finished run checked, with their ETags (S3)
MOSTLY_UNKNOWN = 0.5  # a row is "mostly unknown" when more than this share of its scored tokens are unknown
T = TypeVar("T")


class OutputError(UserError):
    """The output folder cannot be used for this run; the message says why and what to do."""


def part_name(key: str) -> str:
    return f"part-{key}.parquet"


def recorded_values(record: Any) -> dict:
    """`asdict(record)` (a dataclass) less its `ADDED_LATER` fields at their default: a workload's options as
    its fingerprint records them, an audit record as audit.json does. Such a field was added after files
    recording it were written, so folders written before it existed still resume and such a file is
    written back as it was read."""
    later = {f.name: f.default for f in dataclasses.fields(record) if added_later(f)}
    return {k: v for k, v in dataclasses.asdict(record).items() if not (k in later and v == later[k])}


def plan_digest(plan: Iterable[Shard]) -> str:
    """The digest of a shard plan (its keys and row counts) that `_run.json` records as `plan`."""
    return hashlib.sha256("\n".join(f"{s.key} {s.rows}" for s in plan).encode()).hexdigest()


def fingerprint(workload: str, options: Any, config: RunConfig, plan: Iterable[Shard]) -> dict:
    """What must match for a rerun to resume into the same folder: the workload's name and options, the
    model and the input's identity (not batch size or device, which do not change the results)."""
    run = {
        "workload": workload,
        "inputs": list(config.inputs.paths),
        "text_column": config.inputs.text_column,
        "id_column": config.inputs.id_column,
        "shard_rows": config.inputs.shard_rows,
        "partition_column": config.inputs.partition_column,
        "partition_by_file": config.inputs.partition_by_file,
        "model": config.model.name,
        "revision": config.model.revision,
        "dtype": config.model.dtype,
        "plan": plan_digest(plan),
    }
    if config.inputs.extra_columns:  # added later: enters only when set, so earlier folders still resume
        run["extra_columns"] = list(config.inputs.extra_columns)
    if config.inputs.allow_duplicate_ids:  # likewise: rows keyed by id and line (resume and verify know)
        run["allow_duplicate_ids"] = True
    if config.inputs.cost is not None:  # likewise: shards cut by estimated work (`pipeline.sizing`)
        run["shard_cost"] = config.inputs.cost.to_json()
    values = recorded_values(options)
    shadowed = set(values) & (set(run) | set(BOOKKEEPING))
    assert not shadowed, f"options of {workload} shadow the run's own keys: {shadowed}"
    return {**run, **values}


def row_sums(table: pa.Table) -> list[dict] | None:
    """What a shard's marker records of its scored rows for the run's summary (`pipeline.aggregate`), so that the
    summary reads no shard again: per partition value (a `partition` of each group, when the rows have that
    column), the rows, the ok rows and the errors, the sums over the ok rows of the PLL, tokens, words and unknown
    tokens, the ok rows mostly of unknown tokens and the ok rows scored in windows (`--long-texts window`). The
    fields are `CorpusStats`' (`of_table` of the same rows gives the same figures). None for rows without a PLL
    (other workloads summarise their own rows)."""
    if not {S.STATUS, S.PLL, S.N_TOKENS, S.N_WORDS} <= set(table.column_names):
        return None
    if S.PARTITION not in table.column_names:
        return [_sums(table)]
    groups = []
    for value in sorted(pc.unique(table[S.PARTITION]).to_pylist(), key=str):
        mask = pc.is_null(table[S.PARTITION]) if value is None else pc.equal(table[S.PARTITION], value)
        groups.append({"partition": value, **_sums(table.filter(mask))})
    return groups


def _sums(table: pa.Table) -> dict:
    ok = pc.equal(table[S.STATUS], S.STATUS_OK)
    n_ok = pc.sum(ok.cast(pa.int64())).as_py() or 0

    def total(column: str) -> float:
        return pc.sum(pc.filter(table[column], ok)).as_py() or 0

    unknown, mostly = unknown_tokens(table)
    windowed = (
        pc.sum(pc.and_(ok, table[S.WINDOWED]).cast(pa.int64())).as_py() if S.WINDOWED in table.column_names else 0
    )
    return {
        "rows": table.num_rows,
        "ok": n_ok,
        "errors": table.num_rows - n_ok,
        "sum_pll": float(total(S.PLL)),
        "n_tokens": int(total(S.N_TOKENS)),
        "n_words": int(total(S.N_WORDS)),
        "n_unknown": unknown,
        "mostly_unknown": mostly,
        "windowed": windowed or 0,
    }


def unknown_tokens(batch: pa.RecordBatch | pa.Table) -> tuple[int, int]:
    """(unknown tokens, rows mostly unknown) over the ok rows of a batch or table; (0, 0) for shards written
    before the `n_unknown` column existed."""
    if S.N_UNKNOWN not in batch.schema.names:
        return 0, 0
    ok = pc.equal(batch[S.STATUS], S.STATUS_OK)
    unknown, tokens = pc.filter(batch[S.N_UNKNOWN], ok), pc.filter(batch[S.N_TOKENS], ok)
    mostly = pc.greater(pc.multiply(unknown.cast(pa.float64()), 1 / MOSTLY_UNKNOWN), tokens)
    return int(pc.sum(unknown).as_py() or 0), int(pc.sum(mostly.cast(pa.int64())).as_py() or 0)


def encoded(obj: dict) -> bytes:
    """A JSON file's bytes as the folder holds them (markers, `_run.json`, summary.json)."""
    return json.dumps(obj, indent=2, sort_keys=True).encode("utf-8")


def md5(data: bytes | pa.Buffer) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Known:
    """A marker whose content is known without reading it, for as long as a listing shows its object with
    `etag`: one this process wrote (`etag` the MD5 of its bytes), or one checked when the run last finished
    (`INDEX_FILE`; `file_etag`: the ETag its shard's file was listed with then)."""

    etag: str
    marker: dict
    file_etag: str | None = None


@dataclass(frozen=True)
class ShardCheck:
    """One look at `_done/` and `rows/` (`OutputDir.check_shards`): the sound markers (key -> marker), why each
    other marker cannot be trusted, the sound shards whose files a listing showed to hold the bytes their markers
    describe (listed with the MD5 the marker records: their digest is the marker's too), the files in `rows/`
    (path -> ETag, as `OutputDir.listing`) and the ETags of each sound shard's marker and file."""

    markers: dict[str, dict]
    problems: dict[str, str]
    proven: set[str]
    files: dict[str, str | None]
    etags: dict[str, tuple[str | None, str | None]]


class OutputDir:
    """A run's output folder on any pyarrow filesystem."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.root = filesystem(uri)
        if self.fs is None:
            raise OutputError(f"cannot write to {uri!r}: use a local path or an s3://, gs:// or file:// URI")
        # What other processes (Ray workers, whatever their working folder) open as the same folder.
        self.location = self.root if scheme(uri) in (None, "file") else uri
        # An object store: no folders to make, a PUT is whole (no temporary name and rename: a copy and a
        # delete there), and storage errors are sent again for a while (`storage.retrying`).
        self.object_store = not isinstance(self.fs, pafs.LocalFileSystem)
        self.s3 = isinstance(self.fs, pafs.S3FileSystem)  # lists ETags (through boto3)
        self._client: Any = None  # boto3's S3 client, made on first use
        self._written: dict[str, Known] = {}  # the markers this process wrote
        self._index: dict[str, Known] | None = None  # INDEX_FILE's markers, once read

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Turn an OS error while creating or writing the folder (read-only, a file in the way) into one
        line that says what to do."""
        try:
            yield
        except OSError as exc:
            raise OutputError(
                f"cannot create or write the output folder {self.uri!r} ({exc}); pass an --output you can write to"
            ) from exc

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def part_path(self, key: str) -> str:
        return self.path(ROWS_DIR, part_name(key))

    def marker_path(self, key: str) -> str:
        return self.path(DONE_DIR, f"{key}.json")

    def open_shards(self) -> set[str]:
        """Make `rows/` and `_done/` ready for an admitted run (`claim.Claim.admit`): temporary files of a
        killed run removed; returns the keys of the shards already done."""
        with self.writing():
            if not self.object_store:
                self.fs.create_dir(self.path(DONE_DIR), recursive=True)
                self.fs.create_dir(self.path(ROWS_DIR), recursive=True)
            for stale in self.files(ROWS_DIR, suffix=".tmp") + self.files(DONE_DIR, suffix=".tmp"):
                self._delete(stale)
        return self.done_keys()

    def refuse_another(self, previous: dict, run: dict, keys: Iterable[str] | None = None) -> None:
        """Refuse a folder whose `_run.json` (`previous`) is another run's than `run`, saying how they differ;
        `keys`: compare only these (default: every key of either but the bookkeeping)."""
        keys = set(run) | set(previous) if keys is None else set(keys)
        run = json.loads(json.dumps(run))  # as `_run.json` holds it: tuples are lists
        changed = sorted(k for k in keys if k not in BOOKKEEPING and run.get(k) != previous.get(k))
        if changed:
            edited = changed_files(previous[INPUT_FILES], run.get(INPUT_FILES, {})) if INPUT_FILES in previous else []
            unknown = [k for k in changed if k not in run]
            newer = [k for k in changed if k not in previous]
            raise OutputError(
                f"{self.uri} holds results of a different run (it differs in: {', '.join(changed)}"
                + (f"; changed since: {', '.join(edited)}" if edited else "")
                + (
                    f"; it records {', '.join(f'{k} {previous[k]!r}' for k in unknown)}, which this run does not set: "
                    "an option this run leaves at its earlier default, or one of another workload or an older dscore"
                    if unknown
                    else ""
                )
                + (
                    f"; it records no {', '.join(newer)}: written before that option existed, with its earlier "
                    "behaviour (docs/runs.md)"
                    if newer
                    else ""
                )
                + "); use another --output, or pass --overwrite to replace them"
            )

    def marker_keys(self) -> list[str]:
        """Keys of the shards with a completion marker, sorted (the marker itself is not checked here)."""
        return sorted(posixpath.basename(m).removesuffix(".json") for m in self.files(DONE_DIR, suffix=".json"))

    def marked_parts(self) -> list[str]:
        """The Parquet files of the marked shards, in key order: the run's rows. A Parquet file in `rows/`
        without a marker (a copied shard, one of a run killed before its marker) is left out, with a warning."""
        parts = [self.part_path(key) for key in self.marker_keys()]
        present = set(self.files(ROWS_DIR, suffix=".parquet"))
        self.warn_unmarked(present - set(parts))
        return [p for p in parts if p in present]

    def warn_unmarked(self, paths: Iterable[str]) -> None:
        """Name each Parquet file in `rows/` without a marker: no row of the run."""
        for path in sorted(paths):
            logger.warning(
                "%s/%s has no completion marker, so it is no row of this run: left out (dscore verify "
                "names it; delete it if it is a copy)",
                self.uri,
                posixpath.relpath(path, self.root),
            )

    def row_parts(self) -> list[str]:
        """The Parquet files of the rows: of a run folder (it has `_done/`) the marked shards, of a folder of
        Parquet files written elsewhere every one in `rows/`."""
        if self.exists(self.path(DONE_DIR)):
            return self.marked_parts()
        return sorted(self.files(ROWS_DIR, suffix=".parquet"))

    def read_rows(self, columns: list[str] | None = None) -> pa.Table:
        """The marked shards' rows (`columns` of them), as one table."""
        parts = self.marked_parts()
        if not parts and self._planned_nothing():  # an empty input: a finished run of no rows
            return pa.table({name: pa.array([], pa.null()) for name in columns or ()})
        if not parts:
            raise OutputError(f"{self.uri} holds no finished shard: rerun the command that wrote it")
        return pq.ParquetDataset(parts, filesystem=self.fs).read(columns=columns)

    def _planned_nothing(self) -> bool:
        """Whether the folder's run planned no shard (its inputs hold no row)."""
        try:
            run = self.read_json(RUN_FILE)
        except ValueError:
            return False
        return run is not None and run.get(SHARDS) == {}

    def done_keys(self) -> set[str]:
        """Keys of the shards that are really done (`check_shards`). Any other marker is removed (saying why),
        so its shard is scored again."""
        check = self.check_shards()
        for key, problem in sorted(check.problems.items()):
            logger.warning("shard %s is scored again: %s", key, problem)
            self._delete(self.marker_path(key))
        return set(check.markers)

    def check_shards(self) -> ShardCheck:
        """Every marked shard checked against its file: its marker valid JSON with a row count, its file there and
        holding that many rows (its footer read). On S3 one listing of each folder, with ETags, stands in for
        most reads: a marker known unchanged (`Known`) is not read, nor is its file's footer when the file is
        listed with the MD5 that marker records, or with the ETag it had when the run last finished and checked it."""
        markers = {p: e for p, e in self.listing(DONE_DIR).items() if p.endswith(".json")}
        files = {p: e for p, e in self.listing(ROWS_DIR).items() if p.endswith(".parquet")}
        known = self._known() if self.s3 else {}
        check = ShardCheck({}, {}, set(), files, {})
        for path, etag in sorted(markers.items()):
            key = posixpath.basename(path).removesuffix(".json")
            part = self.part_path(key)
            was = known.get(key)
            if was is not None and etag == was.etag:  # the marker as this process wrote it, or the run last checked it
                marker, problem = was.marker, None
                unchanged = files.get(part) is not None and files.get(part) in (marker.get(FILE_MD5), was.file_etag)
            else:
                marker, problem = self._read_marker_checked(key)
                unchanged = False
            if problem is None and part not in files:
                problem = "its Parquet file is missing"
            if problem is None and not unchanged:
                problem = self._rows_problem(key, marker["rows"])
            if problem is not None:
                check.problems[key] = problem
                continue
            check.markers[key] = marker
            check.etags[key] = (etag, files[part])
            if files[part] is not None and files[part] == marker.get(FILE_MD5):
                check.proven.add(key)
        return check

    def _read_marker_checked(self, key: str) -> tuple[dict, str | None]:
        """Shard `key`'s marker read, and why it cannot be trusted (None: it can, so far)."""
        try:
            marker = self.read_marker(key)
        except ValueError:
            return {}, "its completion marker is not valid JSON (a write was cut off)"
        if not isinstance(marker, dict) or not isinstance(marker.get("rows"), int):
            return {}, "its completion marker has no row count"
        return marker, None

    def _rows_problem(self, key: str, rows: int) -> str | None:
        """Whether shard `key`'s file holds `rows` rows, by its footer (so that its row count is its own)."""
        path = self.part_path(key)
        try:
            found = self._request(
                lambda: pq.read_metadata(path, filesystem=self.fs).num_rows, f"reading {self.location_of(path)}"
            )
        except (OSError, pa.ArrowInvalid) as exc:
            return f"its Parquet file cannot be read ({exc})"
        return None if found == rows else f"its Parquet file holds {found} rows, its marker says {rows}"

    def _known(self) -> dict[str, Known]:
        """The markers known without reading them: those this process wrote, and the index's."""
        if self._index is None:
            self._index = self._read_index()
        return {**self._index, **self._written}

    def _read_index(self) -> dict[str, Known]:
        name = posixpath.join(DONE_DIR, INDEX_FILE)
        data = self.read_bytes(name)
        if data is None:
            return {}
        try:
            entries = [json.loads(line) for line in data.splitlines() if line.strip()]
            index = {e["key"]: Known(e["etag"], e["marker"], e.get("file_etag")) for e in entries}
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s is damaged (%s): every marker is read instead", self.location_of(self.path(name)), exc)
            return {}
        return {k: v for k, v in index.items() if isinstance(v.marker, dict) and isinstance(v.marker.get("rows"), int)}

    def keep_index(self, check: ShardCheck, keys: Iterable[str]) -> None:
        """Keep the sound markers of `keys` (a finished run's shards, from `check`) in `INDEX_FILE` with the ETags
        they and their files were listed with, so that a rerun or `dscore verify` reads that one file instead of
        each marker. Only on S3, whose listings carry ETags; not rewritten when it holds them already."""
        if not self.s3:
            return
        index = {
            k: Known(check.etags[k][0], check.markers[k], check.etags[k][1])
            for k in sorted(keys)
            if k in check.markers and check.etags[k][0] is not None
        }
        if index == self._index:
            return
        lines = [
            json.dumps({"key": k, "etag": v.etag, "file_etag": v.file_etag, "marker": v.marker}, sort_keys=True)
            for k, v in index.items()
        ]
        self.write_bytes(posixpath.join(DONE_DIR, INDEX_FILE), "".join(f"{line}\n" for line in lines).encode())
        self._index = index

    def write_shard(self, key: str, table: pa.Table, signature: dict, input_digest: str) -> None:
        """Write the shard's rows, then its marker: the scorer's signature, the digest of the input rows
        (checked on resume, see `provenance.py`), of the file's bytes (checked by `dscore verify`; their MD5 is
        what S3 lists) and what the run's summary adds up (`row_sums`)."""
        final = self.part_path(key)
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        data = buffer.getvalue()
        if self.object_store:  # one PUT, whole or not at all; the marker written after it commits the shard
            self._put(final, data)
        else:
            self._write_through(self.path(ROWS_DIR, f".{part_name(key)}.{uuid.uuid4().hex}.tmp"), final, data)
        marker = {
            "rows": table.num_rows,
            "signature": signature,
            DIGEST: input_digest,
            FILE_DIGEST: hashlib.sha256(data).hexdigest(),
            FILE_MD5: md5(data),
        }
        sums = row_sums(table)
        if sums is not None:
            marker[ROW_SUMS] = sums
        written = encoded(marker)
        self.write_bytes(posixpath.join(DONE_DIR, f"{key}.json"), written)
        if self.s3:
            self._written[key] = Known(md5(written), json.loads(written))

    def read_marker(self, key: str) -> dict | None:
        return self.read_json(posixpath.join(DONE_DIR, f"{key}.json"))

    def write_json(self, name: str, obj: dict) -> None:
        self.write_bytes(name, encoded(obj))

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes | pa.Buffer) -> None:
        """Write a file whole or not at all: locally through a hidden temporary file and a rename (a
        reader never sees half a marker); an object store's single PUT is already all or nothing."""
        path = self.path(name)
        if self.object_store:
            self._put(path, data)
            return
        temporary = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        self.fs.create_dir(posixpath.dirname(path), recursive=True)  # a file in a sub-folder (a rescored list's)
        self._write_through(temporary, path, data)

    def _put(self, path: str, data: bytes | pa.Buffer) -> None:
        """One object written whole (an object store's PUT), sent again after a transient error."""

        def put() -> None:
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)

        retrying(put, f"writing {self.location_of(path)}")

    def _request(self, request: Callable[[], T], what: str) -> T:
        """`request()`; on an object store sent again after a transient error (`storage.retrying`), on a local
        disk once (a full disk is no error that passes)."""
        return retrying(request, what) if self.object_store else request()

    def _delete(self, path: str) -> None:
        self._request(lambda: self.fs.delete_file(path), f"deleting {self.location_of(path)}")

    def location_of(self, path: str) -> str:
        return join(self.uri, posixpath.relpath(path, self.root))

    def _write_through(self, temporary: str, final: str, data: bytes | pa.Buffer) -> None:
        """`data` into `temporary`, then renamed to `final`; a write that fails (a full disk) deletes its
        temporary file before the error goes on, so it leaves nothing behind."""
        try:
            with self.fs.open_output_stream(temporary) as stream:
                stream.write(data)
            self.fs.move(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(temporary)
            raise

    def write_table(self, name: str, table: pa.Table) -> str:
        """Write `table` as Parquet at `name` (its folder created); returns where other processes find it."""
        if self.object_store:  # one PUT, sent again after a transient error
            buffer = pa.BufferOutputStream()
            pq.write_table(table, buffer)
            self._put(self.path(name), buffer.getvalue())
        else:
            self.fs.create_dir(posixpath.dirname(self.path(name)), recursive=True)
            pq.write_table(table, self.path(name), filesystem=self.fs)
        return join(self.location, name)

    def read_json(self, name: str) -> dict | None:
        data = self.read_bytes(name)
        return None if data is None else json.loads(data)

    def read_bytes(self, name: str) -> bytes | None:
        """The file's bytes, or None when it is not there."""

        def read() -> bytes | None:
            try:
                with self.fs.open_input_stream(self.path(name)) as stream:
                    return stream.read()
            except FileNotFoundError:
                return None

        if not self.object_store and not self.exists(self.path(name)):
            return None
        return self._request(read, f"reading {self.location_of(self.path(name))}")

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def files(self, folder: str, suffix: str) -> list[str]:
        return sorted(path for path in self.listing(folder) if path.endswith(suffix))

    def listing(self, folder: str) -> dict[str, str | None]:
        """The files directly in `folder`: path -> ETag (on S3, the MD5 of an object written in one PUT; None where
        the store lists none); one request per 1,000 files on S3."""
        what = f"listing {self.location_of(self.path(folder))}"
        if self.s3:
            return self._request(lambda: self._s3_listing(folder), what)
        selector = pafs.FileSelector(self.path(folder), allow_not_found=True)
        infos = self._request(lambda: self.fs.get_file_info(selector), what)
        return {i.path: None for i in infos if i.type == pafs.FileType.File}

    def _s3_listing(self, folder: str) -> dict[str, str | None]:
        bucket, _, prefix = self.path(folder).partition("/")
        found: dict[str, str | None] = {}
        if self._client is None:
            self._client = s3_client(self.fs)
        with boto_errors(self.location_of(self.path(folder))):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=bucket, Prefix=f"{prefix.rstrip('/')}/", Delimiter="/"):
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):  # a folder-marker object of an earlier dscore
                        found[f"{bucket}/{item['Key']}"] = item["ETag"].strip('"')
        return found
