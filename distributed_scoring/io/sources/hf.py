"""Hugging Face `datasets` folders (`save_to_disk`) as input, read by row index."""

from __future__ import annotations

import hashlib
import posixpath
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs

from ...config import InputSpec
from ..inputs import InputFile
from ..storage import filesystem
from .base import Shard, named_columns, require_columns, row_shards, table_rows


def _hf_dataset(f: InputFile):
    from datasets import load_from_disk

    fs, path = filesystem(f.path)
    if not isinstance(fs, pafs.LocalFileSystem):
        path = _downloaded(fs, path, f.path)
    return load_from_disk(path)


def _downloaded(fs: pafs.FileSystem, path: str, uri: str) -> str:
    """A `datasets` folder on an object store, copied into a local cache folder named by its URI and its
    files' sizes and times (a process that reads another shard of it copies nothing; a changed folder is copied
    again), since `load_from_disk` reads local files. Never a local folder of the same name."""
    infos = sorted(
        (i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File),
        key=lambda i: i.path,
    )
    identity = "\n".join(f"{i.path} {i.size} {i.mtime_ns}" for i in infos)
    digest = hashlib.sha256(f"{uri}\n{identity}".encode()).hexdigest()[:24]
    local = Path(tempfile.gettempdir()) / "dscore-datasets" / digest
    if (local / ".complete").exists():
        return str(local)
    partial = local.with_name(f".{digest}.{uuid.uuid4().hex}.tmp")
    for info in infos:
        target = partial / posixpath.relpath(info.path, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(info.path, str(target), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    (partial / ".complete").touch()
    try:
        partial.rename(local)  # another process may have finished the same copy first: then use its
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    return str(local)


def hf_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    dataset = _hf_dataset(f)
    require_columns(f, spec, dataset.column_names)
    n_rows = len(dataset)
    return row_shards(f, n_rows, spec.shard_rows)


def hf_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    dataset = _hf_dataset(shard.file)
    columns = named_columns(spec) + [c for c in spec.extra_columns if c in dataset.column_names]
    dataset = dataset.select_columns(columns).with_format("arrow")
    yield from table_rows(dataset[shard.start : shard.start + shard.rows], shard, spec)
