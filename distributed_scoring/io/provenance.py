"""What a run folder records about its inputs, so a resume can tell an input that changed under it.

Two levels, cheap first: `_run.json` holds each input file's identity (size and modification time, from
the filesystem's metadata: no bytes read), and each shard's marker holds a digest of the rows read for
it (computed where the shard is read, from what the reader reads anyway). On resume only a file whose
identity changed has its done shards read again (not scored) and their digests compared: a file merely
touched or copied resumes; one whose content changed is refused, naming it. An edit that keeps both the
size and the modification time (`cp -p` of a same-size file) is not seen; `--overwrite` starts afresh.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.fs as pafs

from ..config import InputSpec
from ..errors import UserError
from .sources import Shard, read_unit, read_units
from .storage import filesystem

INPUT_FILES = "input_files"  # the key of `_run.json` that holds the identities
DIGEST = "input_digest"  # the key of a shard's marker that holds its rows' digest


class InputChangedError(UserError):
    """An input file changed since shards of this folder were scored from it."""


def file_identities(plan: list[Shard]) -> dict[str, dict | None]:
    """Size and mtime of every planned input file (None where the storage cannot say: https://)."""
    return {path: _identity(path) for path in dict.fromkeys(s.file.path for s in plan)}


def _identity(uri: str) -> dict | None:
    """A file's size and mtime; a folder's (a `datasets` folder) total size and latest mtime."""
    fs, path = filesystem(uri)
    if fs is None:
        return None
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        files = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File]
        return {"size": sum(i.size for i in files), "mtime_ns": max((i.mtime_ns or 0 for i in files), default=0)}
    return {"size": info.size, "mtime_ns": info.mtime_ns}


def changed_files(recorded: dict | None, now: dict[str, dict | None]) -> list[str]:
    """Input files whose identity differs from what the folder recorded (all of them when none was)."""
    recorded = recorded or {}
    return [path for path, identity in now.items() if path not in recorded or recorded[path] != identity]


def rows_digest(rows: pa.Table) -> str:
    """A digest of a shard's rows as read (ids, texts, read errors): what its scores depend on."""
    digest = hashlib.blake2b(digest_size=16)
    for row in rows.to_pylist():
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def check_unchanged(path: str, done: list[Shard], markers: dict[str, dict], spec: InputSpec) -> None:
    """Read the done shards of `path` again and refuse when any digest differs from its marker's."""
    for unit in read_units(done):
        for shard, rows in read_unit(unit, spec):
            recorded = markers[shard.key].get(DIGEST)
            if recorded != rows_digest(rows):
                reason = "was edited" if recorded else "cannot be checked (its marker records no digest)"
                raise InputChangedError(
                    f"input {path} changed since this folder's shards were scored: shard {shard.key} (rows "
                    f"{shard.start + 1}-{shard.start + shard.rows}) {reason}; pass --overwrite to score it "
                    "afresh, or use another --output"
                )
