"""Finding the input files: files, folders, globs and URIs, each with a format and a stable name.

The name is what row ids are made of (`<name>:<row>`): a file given directly is named by its base
name; a file found in a folder or by a glob by the folder's name and its path below it
(`corpus/part-1.txt`), so ids do not depend on where the data sits. Two inputs with one name are
refused, since their ids would collide.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pyarrow.fs as pafs

from ..errors import UserError
from .storage import COMPRESSIONS, error_reason, filesystem, join, scheme

FORMATS = ("text", "jsonl", "csv", "tsv", "parquet", "hf")
_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_MAGIC = re.compile(r"[*?\[]")


class InputError(UserError):
    """The input cannot be read as asked (missing file, unknown column, ...); the message says how to fix it."""


@dataclass(frozen=True)
class InputFile:
    index: int  # position among all inputs: part of every shard key
    path: str  # local path or URI
    name: str  # used in row ids
    fmt: str
    columns: tuple[str, ...] = field(default=())  # CSV/TSV header, read when planning


def detect_format(path: str) -> str:
    """By suffix, after a compression suffix: .jsonl/.ndjson, .csv, .tsv, .parquet; else text lines."""
    suffixes = [s.lower() for s in PurePosixPath(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return _SUFFIX_FORMATS.get(suffixes[-1] if suffixes else "", "text")


def find_inputs(paths: tuple[str, ...]) -> list[InputFile]:
    """Expand every input into files, in a stable order, and check their names are unique."""
    found: list[tuple[str, str, str]] = []  # (path, name, format)
    for given in paths:
        try:
            found += _expand(given)
        except OSError as exc:  # an object store that cannot be listed or reached
            raise InputError(
                f"cannot read input {given!r} ({error_reason(exc)}); check the URI, the network and the credentials"
            ) from exc
    files = [InputFile(i, path, name, fmt) for i, (path, name, fmt) in enumerate(found)]
    seen: dict[str, str] = {}
    for f in files:
        if f.name in seen:
            raise InputError(
                f"inputs {seen[f.name]!r} and {f.path!r} share the name {f.name!r}, so their row ids would "
                "collide; rename one, or give an --id-column"
            )
        seen[f.name] = f.path
    return files


def _expand(given: str) -> list[tuple[str, str, str]]:
    fs, path = filesystem(given)
    if fs is None:  # smart-open only: a single file, no listing
        return [(given, posixpath.basename(given), detect_format(given))]
    # What reopens to the same filesystem: the absolute path for local inputs, else the URI.
    ref = path if scheme(given) in (None, "file") else given.rstrip("/")
    if _MAGIC.search(path):
        return _glob(given, fs, path, ref)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [(ref, posixpath.basename(path), detect_format(path))]
    if info.type == pafs.FileType.Directory:
        folder = posixpath.basename(path.rstrip("/"))
        datasets = _hf_datasets(ref, fs, path, folder)
        if datasets is not None:
            return datasets
        files = _listing(fs, path)
        if not files:
            raise InputError(f"input folder {given!r} holds no files")
        return [(join(ref, rel), f"{folder}/{rel}", detect_format(rel)) for rel in files]
    raise InputError(f"input {given!r} does not exist")


def _listing(fs: pafs.FileSystem, root: str) -> list[str]:
    """Relative paths of the files below `root`, sorted; hidden and `_`-prefixed entries skipped."""
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    out = []
    for info in infos:
        rel = posixpath.relpath(info.path, root)
        if info.type == pafs.FileType.File and not any(p.startswith((".", "_")) for p in rel.split("/")):
            out.append(rel)
    return sorted(out)


def _glob(given: str, fs: pafs.FileSystem, path: str, ref: str) -> list[tuple[str, str, str]]:
    """`*` and `?` stay within one path segment, `**/` spans any number of them."""
    parts, ref_parts = path.split("/"), ref.split("/")
    magic = len(parts) - next(i for i, p in enumerate(parts) if _MAGIC.search(p))  # segments from the end
    base = "/".join(parts[:-magic]) or "/"
    pattern = _glob_regex("/".join(parts[-magic:]))
    matches = [rel for rel in _listing(fs, base) if pattern.fullmatch(rel)]
    if not matches:
        raise InputError(f"input pattern {given!r} matches no files")
    folder = posixpath.basename(base.rstrip("/"))
    ref_base = "/".join(ref_parts[:-magic])
    return [(join(ref_base, rel), f"{folder}/{rel}", detect_format(rel)) for rel in matches]


def _glob_regex(pattern: str) -> re.Pattern:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _hf_datasets(ref: str, fs: pafs.FileSystem, path: str, folder: str) -> list[tuple[str, str, str]] | None:
    """A `datasets` folder saved with `save_to_disk`: one input per split of a DatasetDict."""
    if fs.get_file_info(path + "/state.json").type == pafs.FileType.File:
        return [(ref, folder, "hf")]
    dict_file = path + "/dataset_dict.json"
    if fs.get_file_info(dict_file).type == pafs.FileType.File:
        with fs.open_input_stream(dict_file) as stream:
            splits = json.loads(stream.read())["splits"]
        return [(join(ref, split), f"{folder}/{split}", "hf") for split in splits]
    return None
