"""`dscore verify`: a sound run folder passes; each kind of damage is named and fails it (exit 1); a
folder that is no run folder is exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
from distributed_scoring.io import schema as S
from distributed_scoring.pipeline.runner import run
from distributed_scoring.pipeline.stage import Stage
from distributed_scoring.pipeline.workload import Workload
from distributed_scoring.workflows.score import score

from helpers import tiny


def write_corpus(folder: Path) -> Path:
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    return corpus


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("verify")
    config = RunConfig(
        InputSpec((str(write_corpus(root)),), shard_rows=4),
        ModelSpec(str(tiny_model_dir("bert"))),
        output=str(root / "out"),
    )
    score(config)
    return root / "out"


@pytest.fixture
def out(finished, tmp_path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(finished, copy)
    return copy


def parts(out: Path) -> list[Path]:
    return sorted((out / "rows").glob("part-*.parquet"))


def rewrite(out: Path, part: Path, table: pa.Table) -> None:
    """Replace a shard's file with `table`, its marker keeping its row count but no digest of the bytes."""
    pq.write_table(table, part)
    marker = out / "_done" / f"{part.stem.removeprefix('part-')}.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "file_sha256": None}))


def duplicate_an_id(out: Path) -> None:
    first, second = parts(out)[:2]
    table = pq.read_table(second)
    ids = table.column(S.ID).to_pylist()
    ids[0] = pq.read_table(first).column(S.ID)[0].as_py()
    rewrite(out, second, table.set_column(table.schema.get_field_index(S.ID), S.ID, pa.array(ids)))


def marker_mismatch(out: Path) -> None:
    marker = sorted((out / "_done").glob("*.json"))[1]
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "rows": 3}))


def other_bytes(out: Path) -> None:
    part = parts(out)[1]
    pq.write_table(pq.read_table(part), part, compression="gzip")  # same rows, not the bytes written


DAMAGE = {
    "duplicated id": (duplicate_an_id, "1 id appears more than once"),
    "missing shard file": (lambda out: parts(out)[2].unlink(), "its Parquet file is missing"),
    "marker mismatch": (marker_mismatch, "holds 4 rows, its marker says 3"),
    "file not the one written": (other_bytes, "bytes differ"),
    "stray temporary file": (lambda out: (out / "rows" / ".part-x.parquet.1.tmp").write_text("x"), "temporary file"),
    "file without a marker": (
        lambda out: shutil.copy(parts(out)[0], out / "rows" / "part-99999.parquet"),
        "without a completion marker",
    ),
    "summary of other rows": (
        lambda out: (out / "summary.json").write_text(json.dumps({"rows": 99})),
        "counts 99 rows, the files hold 14",
    ),
}


def test_a_sound_folder_passes(out, capsys):
    assert main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"OK: {out}: 4 shards, {len(tiny.CORPUS)} rows"


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damage_is_named_and_fails(out, how, capsys):
    damage, problem = DAMAGE[how]
    damage(out)
    assert main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"FAILED: {out}")
    assert any(re.search(problem, line) for line in lines[:-1]), lines


def _lock_of(pid: int, heartbeat: float) -> str:
    from distributed_scoring.io.lock import Holder, current_pid_namespace

    return Holder(socket.gethostname(), pid, current_pid_namespace(), heartbeat, heartbeat, "x").encoded().decode()


def test_a_folder_left_by_a_killed_run_is_incomplete_not_failed(out, capsys):
    """kill -9 leaves the lock of a pid that is gone: the run did not finish, and the same command finishes it
    (before: FAILED, as if the folder were damaged)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / "_lock.json").write_text(_lock_of(dead.pid, time.time()))
    assert main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"INCOMPLETE: {out}") and "which is gone" in lines[0], lines


def test_a_folder_a_live_run_holds_is_in_use(out, capsys):
    """verify on a folder a live run is writing said FAILED (13 of 13 tries); now IN USE, naming the holder."""
    (out / "_lock.json").write_text(_lock_of(os.getpid(), time.time()))
    assert main(["verify", str(out)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"IN USE: {out}: a run is writing it (pid {os.getpid()} on ") and "\n" not in line


def test_a_folder_that_is_not_a_run_folder_is_exit_2(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "holds no _run.json" in capsys.readouterr().err


# verify used to say "OK: 0 shards, 0 rows" of a run that stalled before its first shard,
# and "OK: 3 shards, 12 rows" of a finished folder whose last shard and summary.json were deleted.


def drop_shards(out: Path, which: slice) -> list[str]:
    keys = []
    for marker in sorted((out / "_done").glob("*.json"))[which]:
        (out / "rows" / f"part-{marker.stem}.parquet").unlink()
        marker.unlink()
        keys.append(marker.stem)
    return keys


INCOMPLETE = {
    "stalled before its first shard": lambda out: (drop_shards(out, slice(None)), (out / "summary.json").unlink()),
    "last shard and summary deleted": lambda out: (drop_shards(out, slice(-1, None)), (out / "summary.json").unlink()),
    "summary deleted": lambda out: (out / "summary.json").unlink(),
    "killed between a shard's file and its marker": lambda out: (
        sorted((out / "_done").glob("*.json"))[-1].unlink(),
        (out / "summary.json").unlink(),
    ),
}


@pytest.mark.parametrize("how", sorted(INCOMPLETE))
def test_an_incomplete_folder_names_what_is_missing(out, how, capsys):
    INCOMPLETE[how](out)
    assert main(["verify", str(out)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"INCOMPLETE: {out}") and "rerun the same command" in lines[-1], lines
    planned = json.loads((out / "_run.json").read_text())["shards"]
    done = {p.stem for p in (out / "_done").glob("*.json")}
    for key in sorted(set(planned) - done):
        assert any(key in line and "not done" in line for line in lines), lines
    assert any("summary.json" in line for line in lines[:-1]), lines


def test_an_older_folder_is_verified_as_well_as_it_can_be(out, capsys):
    """A folder written before _run.json recorded its shards: the plan is made again from its inputs (and
    their digest checked against the recorded one); without its inputs, verify says what it could not check."""
    run = json.loads((out / "_run.json").read_text())
    for key in ("shards", "rows_per_input", "row_key", "outputs", "command"):
        run.pop(key, None)
    (out / "_run.json").write_text(json.dumps(run))
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    missing = drop_shards(out, slice(-1, None))[0]
    assert main(["verify", str(out)]) == 1
    assert f"shard {missing}" in capsys.readouterr().out
    for name in run["inputs"]:
        Path(name).rename(Path(name).with_suffix(".moved"))
    try:
        assert main(["verify", str(out)]) == 1
        lines = capsys.readouterr().out.strip().splitlines()
        assert any(line.startswith("not checked: the shard plan") for line in lines), lines
        assert any("summary.json counts" in line or "rows_expected" in line for line in lines), lines
    finally:
        for name in run["inputs"]:
            Path(name).with_suffix(".moved").rename(name)


@pytest.fixture
def joints_folder(tmp_path, tiny_model_dir) -> Path:
    out = tmp_path / "joints"
    assert (
        main(
            [
                "joints",
                str(write_corpus(tmp_path)),
                "--model",
                str(tiny_model_dir("bert")),
                "--output",
                str(out),
                "--examples",
                "4",
                "--shard-rows",
                "2",
            ]
        )
        == 0
    )
    return out


def test_the_parent_folder_of_a_joints_run_verifies_its_sub_run(joints_folder, capsys):
    """verify of a `dscore joints` folder used to say "not a run folder" (exit 2): its run is DIR/scores."""
    out = joints_folder
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"OK: {out}: joints run with 1 run" and any(f"{out}/scores" in line for line in lines), lines
    drop_shards(out / "scores", slice(-1, None))
    assert main(["verify", str(out)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"INCOMPLETE: {out}")


# verify told the rows of a workload writing several rows per id apart by a fixed table of
# columns (construction, sequence, chain, epoch); a workload keyed by any other column failed as "ids appear
# more than once". The workload declares its key, the run records it in _run.json, verify reads it there.


@dataclass(frozen=True)
class CopiesOptions:
    copies: int = 2


class Copies(Stage):
    """Writes each row `copies` times, told apart by `copy`: a key column no table in verify names."""

    reads = {S.ID: "kept", S.STATUS: "kept", S.ERROR: "kept"}
    writes = pa.schema(
        [
            pa.field(S.ID, pa.string()),
            pa.field("copy", pa.int32()),
            pa.field(S.STATUS, pa.string()),
            pa.field(S.ERROR, pa.string()),
        ]
    )
    signature = {"model": "copies"}

    def process(self, rows):
        return [
            {**S.key(row), "copy": c, S.STATUS: row[S.STATUS], S.ERROR: row[S.ERROR]}
            for row in rows
            for c in range(CopiesOptions().copies)
        ]


def unchanged(table: pa.Table) -> pa.Table:
    return table


def make_unchanged():
    return unchanged


@pytest.fixture
def copies(tmp_path) -> Path:
    config = RunConfig(
        InputSpec((str(write_corpus(tmp_path)),), shard_rows=4), ModelSpec("copies"), output=str(tmp_path / "out")
    )
    run(config, Workload("copies", CopiesOptions(), make_unchanged, Copies, "cpu", rows_per_input=2, row_key=("copy",)))
    return tmp_path / "out"


def test_the_row_key_a_workload_declares_is_recorded_and_verified(copies, capsys):
    assert json.loads((copies / "_run.json").read_text())["row_key"] == ["id", "copy"]
    assert main(["verify", str(copies)]) == 0
    assert capsys.readouterr().out.strip() == f"OK: {copies}: 4 shards, {2 * len(tiny.CORPUS)} rows"
    part = parts(copies)[1]
    table = pq.read_table(part)
    rewrite(
        copies,
        part,
        table.set_column(table.schema.get_field_index("copy"), "copy", pa.array([0] * table.num_rows, pa.int32())),
    )
    assert main(["verify", str(copies)]) == 1
    assert "4 ids appear more than once" in capsys.readouterr().out


def test_rows_without_a_column_of_their_recorded_key_fail(copies, capsys):
    for part in parts(copies):
        rewrite(copies, part, pq.read_table(part).drop_columns(["copy"]))
    assert main(["verify", str(copies)]) == 1
    assert "rows/ lacks the column copy" in capsys.readouterr().out


def test_an_earlier_folder_without_a_row_key_is_keyed_as_before(joints_folder, capsys):
    """A joints run (several rows per id, by construction) written before _run.json recorded its key."""
    run_file = joints_folder / "scores" / "_run.json"
    recorded = json.loads(run_file.read_text())
    assert recorded["row_key"] == ["id", "construction"]
    run_file.write_text(json.dumps({k: v for k, v in recorded.items() if k != "row_key"}))
    capsys.readouterr()
    assert main(["verify", str(joints_folder)]) == 0, capsys.readouterr().out


def test_the_verdict_counts_in_the_singular_for_one():
    """verify said "rescore run with 1 run(s)"; one of anything is now singular, several plural."""
    from distributed_scoring.workflows.verify import Verification, report

    one = Verification("d/mlm", shards=1, rows=1)
    assert report(one) == "OK: d/mlm: 1 shard, 1 row"
    assert report(Verification("d", problems=("x",))).endswith("FAILED: d: 1 problem")
    assert report(Verification("d", shards=1, planned=2, rows=3, missing=("y",))).endswith(
        "INCOMPLETE: d: 1 of 2 shards done, 3 rows; rerun the same command to finish"
    )
    assert report(Verification("d", shards=2, rows=0)) == "OK: d: 2 shards, 0 rows"
