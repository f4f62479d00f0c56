"""The write stage and the output folder: one Parquet file per shard, a completion marker per shard.

Layout: `DIR/rows/part-<shard>.parquet` (the scored rows, readable as one dataset:
`pyarrow.parquet.read_table("DIR/rows")`), `DIR/summary.json`, and the bookkeeping `DIR/_run.json`
and `DIR/_done/<shard>.json`.

A shard's file is written under a hidden temporary name (which dataset readers skip) and moved into
place; its marker is written only after that, so a marker always means a complete file. Temporary files
left by a killed run are removed when the next run starts. A rerun on the same folder skips marked shards (resume),
and `_run.json` makes sure the folder belongs to the same run (same inputs, model and options); input files
that changed under a resumed run are caught by `provenance.py`. The rows of a run are its marked shards:
a Parquet file in `rows/` without a marker (a copied shard) is no row of it, and every reader here leaves
it out with a warning. `claim.py` takes the folder for a run (lock, admission, --overwrite), `lock.py`
keeps a second run out, and `verify.py` checks a folder.
Local paths and object-store URIs (`s3://`, `gs://`, `file://`) go through pyarrow filesystems.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import posixpath
import uuid
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..config import RunConfig
from ..errors import UserError
from .provenance import DIGEST, INPUT_FILES, changed_files
from .sources import Shard
from .storage import filesystem, join, retrying, scheme

logger = logging.getLogger(__name__)

ROWS_DIR = "rows"
RUN_FILE = "_run.json"
DONE_DIR = "_done"
SUMMARY_FILE = "summary.json"
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


class OutputError(UserError):
    """The output folder cannot be used for this run; the message says why and what to do."""


def part_name(key: str) -> str:
    return f"part-{key}.parquet"


# Field metadata of a workload option added after runs were written: it enters the fingerprint only when
# it differs from its default, so folders written before it existed still resume.
ADDED_LATER = {"fingerprint": "when set"}


def option_values(options: Any) -> dict:
    """A workload's options (a frozen dataclass) as its fingerprint records them."""
    later = {f.name: f.default for f in dataclasses.fields(options) if f.metadata.get("fingerprint") == "when set"}
    return {k: v for k, v in dataclasses.asdict(options).items() if not (k in later and v == later[k])}


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
    values = option_values(options)
    shadowed = set(values) & (set(run) | set(BOOKKEEPING))
    assert not shadowed, f"options of {workload} shadow the run's own keys: {shadowed}"
    return {**run, **values}


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

    def open_shards(self) -> set[str]:
        """Make `rows/` and `_done/` ready for an admitted run (`claim.Claim.admit`): temporary files of a
        killed run removed; returns the keys of the shards already done."""
        with self.writing():
            if not self.object_store:
                self.fs.create_dir(self.path(DONE_DIR), recursive=True)
                self.fs.create_dir(self.path(ROWS_DIR), recursive=True)
            for stale in self.files(ROWS_DIR, suffix=".tmp") + self.files(DONE_DIR, suffix=".tmp"):
                self.fs.delete_file(stale)
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
            raise OutputError(
                f"{self.uri} holds results of a different run (it differs in: {', '.join(changed)}"
                + (f"; changed since: {', '.join(edited)}" if edited else "")
                + (
                    f"; it records {', '.join(unknown)}, which this workload does not have: written by another "
                    "workload or an older dscore"
                    if unknown
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
        for path in sorted(present - set(parts)):
            logger.warning(
                "%s/%s has no completion marker, so it is no row of this run: left out (dscore verify "
                "names it; delete it if it is a copy)",
                self.uri,
                posixpath.relpath(path, self.root),
            )
        return [p for p in parts if p in present]

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
        """Keys of the shards that are really done: marker readable, file present and whole, row counts
        equal. Any other marker is removed (saying why), so its shard is scored again."""
        done = set()
        present = set(self.files(ROWS_DIR, suffix=".parquet"))  # one listing, not a request per shard file
        for marker in self.files(DONE_DIR, suffix=".json"):
            key = posixpath.basename(marker).removesuffix(".json")
            problem = self.shard_problem(key, present)
            if problem is None:
                done.add(key)
                continue
            logger.warning("shard %s is scored again: %s", key, problem)
            self.fs.delete_file(marker)
        return done

    def shard_problem(self, key: str, present: set[str] | None = None) -> str | None:
        """Why shard `key`'s marker cannot be trusted, or None. `present`: the files a listing of `rows/` found
        (else each is looked up); the file's footer is read either way, so that its row count is its own."""
        try:
            marker = self.read_marker(key)
        except ValueError:
            return "its completion marker is not valid JSON (a write was cut off)"
        if not isinstance(marker, dict) or not isinstance(marker.get("rows"), int):
            return "its completion marker has no row count"
        path = self.part_path(key)
        if path not in present if present is not None else not self.exists(path):
            return "its Parquet file is missing"
        try:
            rows = pq.read_metadata(self.part_path(key), filesystem=self.fs).num_rows
        except (OSError, pa.ArrowInvalid) as exc:
            return f"its Parquet file cannot be read ({exc})"
        if rows != marker["rows"]:
            return f"its Parquet file holds {rows} rows, its marker says {marker['rows']}"
        return None

    def write_shard(self, key: str, table: pa.Table, signature: dict, input_digest: str) -> None:
        """Write the shard's rows, then its marker: the scorer's signature, the digest of the input rows
        (checked on resume, see `provenance.py`) and of the file's bytes (checked by `dscore verify`)."""
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
        }
        self.write_json(posixpath.join(DONE_DIR, f"{key}.json"), marker)

    def read_marker(self, key: str) -> dict | None:
        return self.read_json(posixpath.join(DONE_DIR, f"{key}.json"))

    def write_json(self, name: str, obj: dict) -> None:
        self.write_text(name, json.dumps(obj, indent=2, sort_keys=True))

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a file whole or not at all: locally through a hidden temporary file and a rename (a
        reader never sees half a marker); an object store's single PUT is already all or nothing."""
        path = self.path(name)
        if self.object_store:
            self._put(path, data)
            return
        temporary = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        self._write_through(temporary, path, data)

    def _put(self, path: str, data: bytes | pa.Buffer) -> None:
        """One object written whole (an object store's PUT), sent again after a transient error."""

        def put() -> None:
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)

        retrying(put, f"writing {self.location_of(path)}")

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
        if not self.object_store:
            self.fs.create_dir(posixpath.dirname(self.path(name)), recursive=True)
        pq.write_table(table, self.path(name), filesystem=self.fs)
        return join(self.location, name)

    def read_json(self, name: str) -> dict | None:
        def read() -> bytes | None:
            try:
                with self.fs.open_input_stream(self.path(name)) as stream:
                    return stream.read()
            except FileNotFoundError:
                return None

        if not self.object_store and not self.exists(self.path(name)):
            return None
        data = retrying(read, f"reading {self.location_of(self.path(name))}") if self.object_store else read()
        return None if data is None else json.loads(data)

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def files(self, folder: str, suffix: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(folder), allow_not_found=True))
        return [i.path for i in infos if i.path.endswith(suffix)]
