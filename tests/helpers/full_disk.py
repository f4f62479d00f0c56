"""A full disk in process: a local filesystem whose N-th write of a kind finds no space left (ENOSPC) after
writing half its bytes, as a real full disk does. Patched in as `distributed_scoring.io.output.filesystem` by
tests/faults/test_disk_full.py and by the adversarial trial's full-disk cases (in the forked command)."""

from __future__ import annotations

import errno
from pathlib import Path

import pyarrow.fs as pafs


class HalfWritten:
    """An output stream that writes half of what it is given, then finds the disk full."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def __enter__(self) -> "HalfWritten":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.close()

    def write(self, data: bytes) -> None:
        self.stream.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")


def full_disk_at(kind: str, n: int):
    """A local filesystem on which the `n`-th file of `kind` (a shard's rows, a shard's marker, the run file)
    cannot be written."""

    def wanted(path: str) -> bool:
        name = Path(path).name
        return {
            "shard": name.startswith(".part-"),
            "marker": "/_done/" in path,
            "run file": name.startswith("._run.json"),
        }[kind]

    class FullDisk(pafs.LocalFileSystem):
        written = 0

        def open_output_stream(self, path, *args, **kwargs):
            stream = super().open_output_stream(path, *args, **kwargs)
            if not wanted(path):
                return stream
            FullDisk.written += 1
            return HalfWritten(stream) if FullDisk.written == n else stream

    return FullDisk()
