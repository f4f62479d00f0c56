"""A full disk (any OSError while writing a shard or a marker) ends the run with one line.

It used to end in an OSError traceback and leave a `.tmp` file behind. Now: `dscore: incomplete: ...`
(exit 1) naming the folder and the system's reason when shards were being written, `dscore: error: ...`
(exit 2) when nothing was done yet; no temporary file left; the rerun after freeing space completes with
each row once. The disk is filled in process by a filesystem whose N-th write of a kind raises ENOSPC
(after writing half its bytes, as a real full disk does); on Ray, where the write tasks run in other
processes, by a directory in the way of the file of the one shard a rerun has to write (its rename fails
with EISDIR).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.io import output

from helpers import tiny
from helpers.full_disk import full_disk_at

LINES = 10
SHARD_ROWS = 2  # five shards


def corpus(tmp_path: Path) -> str:
    path = tmp_path / "many.txt"
    path.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(LINES)))
    return str(path)


def run(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def the_dscore_line(err: str, ray: bool = False) -> str:
    """The command's one line, last; no traceback. (The tests' shared Ray keeps its own logging, which
    reports the failed task with its traceback, at any time: a command's own embedded Ray sends that to the
    run log.)"""
    [line] = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert ray or ("Traceback" not in err and err.strip().splitlines()[-1] == line), err
    return line


def temporaries(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def each_row_once(out: Path) -> None:
    ids = Counter(pq.read_table(out / "rows", columns=["id"]).column("id").to_pylist())
    assert set(ids) == {f"many.txt:{i}" for i in range(1, LINES + 1)} and set(ids.values()) == {1}


@pytest.mark.parametrize("kind", ["shard", "marker"])
def test_a_full_disk_while_writing_is_one_incomplete_line_and_the_rerun_completes(
    tmp_path, tiny_model_dir, capsys, monkeypatch, kind
):
    out = tmp_path / "out"
    args = [
        "score",
        corpus(tmp_path),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(out),
        "--shard-rows",
        str(SHARD_ROWS),
    ]
    disk = full_disk_at(kind, 3)
    monkeypatch.setattr(output, "filesystem", lambda uri: (disk, str(Path(uri).resolve())))
    rc, err = run(args, capsys)
    line = the_dscore_line(err)
    assert rc == 1 and line.startswith("dscore: incomplete: the run stopped on an error while writing")
    assert str(out) in line and "No space left on device" in line and "rerun the same command" in line
    assert not temporaries(out)
    assert len(list((out / "_done").glob("*.json"))) == 2  # the shards written before the disk filled are kept
    monkeypatch.undo()  # space freed
    rc, err = run(args, capsys)
    assert rc == 0, err
    each_row_once(out)
    assert not temporaries(out)


def test_a_full_disk_before_any_work_is_an_error_line(tmp_path, tiny_model_dir, capsys, monkeypatch):
    out = tmp_path / "out"
    disk = full_disk_at("run file", 1)
    monkeypatch.setattr(output, "filesystem", lambda uri: (disk, str(Path(uri).resolve())))
    rc, err = run(["score", corpus(tmp_path), "--model", str(tiny_model_dir("bert")), "--output", str(out)], capsys)
    line = the_dscore_line(err)
    assert rc == 2 and line.startswith("dscore: error: cannot create or write the output folder")
    assert "No space left on device" in line and not temporaries(out)


@pytest.mark.ray
def test_on_ray_a_failed_write_is_one_incomplete_line_and_the_rerun_completes(
    tmp_path, tiny_model_dir, capsys, ray_local
):
    out = tmp_path / "out"
    args = [
        "score",
        corpus(tmp_path),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(out),
        "--shard-rows",
        str(SHARD_ROWS),
        "--ray",
        "--num-actors",
        "1",
        "--cpus-per-actor",
        "1",
        "--stall-timeout",
        "600",
    ]
    # (1 CPU: the failed run's actor lives on while pytest's log capture holds its error, and the rerun's
    # actor must fit beside it in the shared Ray)
    assert run(args[:-7], capsys)[0] == 0  # a finished run in this process, whose last shard is then undone
    last = f"00000-{(LINES - SHARD_ROWS):012d}"
    (out / "_done" / f"{last}.json").unlink()
    obstacle = out / "rows" / f"part-{last}.parquet"
    obstacle.unlink()
    (obstacle / "in-the-way").mkdir(parents=True)  # where the rerun writes that shard's file
    rc, err = run(args, capsys)
    line = the_dscore_line(err, ray=True)
    assert rc == 1 and line.startswith("dscore: incomplete: the run stopped on an error while writing"), line
    assert "Is a directory" in line and "UDF" not in line
    assert not temporaries(out)
    (obstacle / "in-the-way").rmdir()
    obstacle.rmdir()
    rc, err = run(args, capsys)
    assert rc == 0, err
    each_row_once(out)
    assert not temporaries(out)
