"""Faults in a run folder: damaged markers and shard files are found on resume and scored again, so
rows in == rows out with each id once; a damaged _run.json is a clear refusal, not a traceback; an
input edited under a resumed run is refused; a second run on a locked folder is refused."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import InputSpec, ModelSpec, RunConfig, ScoringOptions
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.io.lock import FolderLock, FolderLockedError, current_pid_namespace, read_holder
from distributed_scoring.io.output import BOOKKEEPING, OutputDir, OutputError
from distributed_scoring.io.provenance import InputChangedError
from distributed_scoring.pipeline import runner
from distributed_scoring.workflows.score import score

from helpers import tiny

SHARD_ROWS = 4


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    config = RunConfig(
        InputSpec((str(corpus),), shard_rows=SHARD_ROWS),
        ModelSpec(str(tiny_model_dir("bert"))),
        output=str(tmp_path / "out"),
    )
    score(config)
    return config, tmp_path / "out"


def check_whole(out: Path, summary: dict) -> None:
    ids = Counter(pq.read_table(out / "rows", columns=[S.ID]).column(S.ID).to_pylist())
    assert summary["rows"] == len(tiny.CORPUS) == len(ids) and set(ids.values()) == {1}


def damage(out: Path, how: str) -> None:
    marker = sorted((out / "_done").glob("*.json"))[1]
    part = out / "rows" / f"part-{marker.stem}.parquet"
    if how == "empty marker":
        marker.write_text("")
    elif how == "garbage marker":
        marker.write_text('{"rows": 4, "sig')
    elif how == "marker without rows":
        marker.write_text("{}")
    elif how == "truncated shard":
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    elif how == "deleted shard":
        part.unlink()
    elif how == "shard of other length":
        table = pq.read_table(part)
        pq.write_table(table.slice(0, 1), part)


@pytest.mark.parametrize(
    "how",
    [
        "empty marker",
        "garbage marker",
        "marker without rows",
        "truncated shard",
        "deleted shard",
        "shard of other length",
    ],
)
def test_a_damaged_shard_is_scored_again_on_resume(run, how, caplog):
    config, out = run
    damage(out, how)
    summary = score(config)  # before: a JSON error, a missing-file error, or a rows-lost error every time
    check_whole(out, summary)
    assert "is scored again" in caplog.text


def test_a_rerun_of_a_finished_run_says_it_is_already_complete(run, caplog):
    """It said "resuming: 4 of 4 shards already done"; a partly done one still says it resumes."""
    config, out = run
    with caplog.at_level("INFO", logger="distributed_scoring"):
        check_whole(out, score(config))
    assert "already complete: all 4 of its shards were scored before; nothing to score" in caplog.text
    assert "resuming" not in caplog.text
    caplog.clear()
    damage(out, "deleted shard")
    with caplog.at_level("INFO", logger="distributed_scoring"):
        check_whole(out, score(config))
    assert "resuming: 3 of 4 shards already done" in caplog.text and "already complete" not in caplog.text
    assert runner.already_complete(1) == "already complete: its one shard was scored before; nothing to score"


def test_a_damaged_run_file_is_refused_with_what_to_do(run):
    config, out = run
    (out / "_run.json").write_text('{"inputs": [')
    with pytest.raises(OutputError, match="_run.json is damaged.*--overwrite"):
        score(config)
    check_whole(out, score(config, overwrite=True))


def test_json_files_are_written_whole(run):
    _, out = run
    assert not list(out.rglob("*.tmp"))  # temporary files renamed into place, none left behind


def test_overwrite_deletes_only_what_a_run_of_ours_wrote(run):
    config, out = run
    foreign = out / "my-notes.txt"
    foreign.write_text("not a dscore file")
    check_whole(out, score(config, overwrite=True))
    assert foreign.read_text() == "not a dscore file"  # before: every file in the folder was deleted


def test_overwrite_refuses_a_folder_that_holds_no_run(tmp_path, tiny_model_dir):
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    mine = tmp_path / "mine" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("keep")
    config = RunConfig(InputSpec((str(corpus),)), ModelSpec(str(tiny_model_dir("bert"))), output=str(mine.parent))
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="holds no _run.json.*nothing was changed"):
            score(config, overwrite=overwrite)
    assert sorted(p.name for p in mine.parent.iterdir()) == ["notes.txt"] and mine.read_text() == "keep"


def edit_in_place(corpus: Path, line: int, text: str) -> None:
    """Replace one line, keeping the number of lines (and leaving a newer mtime)."""
    lines = corpus.read_text().splitlines()
    lines[line] = text
    corpus.write_text("\n".join(lines) + "\n")
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_an_input_edited_in_place_is_refused_naming_it(run):
    config, out = run
    corpus = Path(config.inputs.paths[0])
    edit_in_place(corpus, 5, "An entirely different sentence of the same line count.")
    with pytest.raises(InputChangedError, match=r"corpus.txt changed.*shard 00000-000000000004.*--overwrite"):
        score(config)  # before: resumed, every old score kept beside the new text
    check_whole(out, score(config, overwrite=True))


def test_a_touched_input_resumes_and_records_its_new_identity(run):
    config, out = run
    corpus = Path(config.inputs.paths[0])
    edit_in_place(corpus, 5, tiny.CORPUS[5])  # same content, newer mtime
    check_whole(out, score(config))
    recorded = json.loads((out / "_run.json").read_text())["input_files"][str(corpus)]
    assert recorded["mtime_ns"] == corpus.stat().st_mtime_ns


def test_a_marker_whose_digest_does_not_match_the_input_is_refused(run):
    config, out = run
    marker = sorted((out / "_done").glob("*.json"))[2]
    data = json.loads(marker.read_text())
    marker.write_text(json.dumps({**data, "input_digest": "0" * 32}))
    corpus = Path(config.inputs.paths[0])
    edit_in_place(corpus, 0, tiny.CORPUS[0])  # the fast check sees a change, so digests are compared
    with pytest.raises(InputChangedError, match=f"shard {marker.stem}"):
        score(config)


def test_markers_record_the_input_and_file_digests(run):
    _, out = run
    for marker in (out / "_done").glob("*.json"):
        data = json.loads(marker.read_text())
        part = out / "rows" / f"part-{marker.stem}.parquet"
        assert data["file_sha256"] == hashlib.sha256(part.read_bytes()).hexdigest()
        assert len(data["input_digest"]) == 32


def write_lock(out: Path, host: str, pid: int, heartbeat: float) -> None:
    lock = {
        "host": host,
        "pid": pid,
        "pid_namespace": current_pid_namespace(),
        "started": heartbeat - 60,
        "heartbeat": heartbeat,
        "token": "other",
    }
    (out / "_lock.json").write_text(json.dumps(lock))


def test_a_live_lock_refuses_a_second_run_even_with_overwrite(run):
    config, out = run
    write_lock(out, "gpu-node-7", 4242, time.time())
    for overwrite in (False, True):
        with pytest.raises(FolderLockedError, match="in use by another run: pid 4242 on gpu-node-7"):
            score(config, overwrite=overwrite)  # before: both runs wrote into the folder
    assert json.loads((out / "_lock.json").read_text())["token"] == "other"  # not broken
    assert (out / "_run.json").exists()


def test_a_run_of_this_host_in_this_process_is_live(run):
    config, out = run
    write_lock(out, socket.gethostname(), os.getpid(), time.time())
    with pytest.raises(FolderLockedError, match="in use by another run"):
        score(config)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_stale_lock_of_another_host_is_taken_over(run, caplog):
    """A run that stopped on a storage error, or a lost node, leaves a lock whose heartbeat stops: once it is
    stale a rerun on any host takes the folder over and resumes (before: refused until deleted by hand)."""
    config, out = run
    write_lock(out, "gpu-node-7", 4242, time.time() - 3600)
    check_whole(out, score(config))
    assert "whose heartbeat is 3600 s old (stale after 600 s); taking the folder over" in caplog.text
    assert not (out / "_lock.json").exists()


def test_the_lock_of_a_killed_run_of_this_host_is_taken_over(run, caplog):
    config, out = run
    write_lock(out, socket.gethostname(), dead_pid(), time.time())
    check_whole(out, score(config))  # a rerun after kill -9 resumes, as before the lock
    assert "no longer exists; taking the folder over" in caplog.text and not (out / "_lock.json").exists()


def test_a_dead_pid_of_another_pid_namespace_is_not_taken_over(run):
    config, out = run
    write_lock(out, socket.gethostname(), dead_pid(), time.time())
    lock = json.loads((out / "_lock.json").read_text())
    (out / "_lock.json").write_text(json.dumps({**lock, "pid_namespace": "another-container"}))
    with pytest.raises(FolderLockedError, match="in use by another run"):
        score(config)


def test_the_lock_is_released_after_a_run_and_after_a_failed_run(run, monkeypatch):
    config, out = run
    assert not (out / "_lock.json").exists()

    def fail(*args, **kwargs):
        assert read_holder(OutputDir(str(out))).pid == os.getpid()  # held while the run works
        raise RuntimeError("scorer crashed")

    monkeypatch.setattr(runner, "execute", fail)  # where every command's run calls it
    with pytest.raises(RuntimeError, match="scorer crashed"):
        score(config, overwrite=True)
    assert not (out / "_lock.json").exists()


def test_the_heartbeat_refreshes_the_lock(tmp_path):
    out = OutputDir(str(tmp_path / "out"))
    with FolderLock(out, heartbeat_s=0.05) as lock:
        first = lock.holder.heartbeat
        time.sleep(0.3)
        assert read_holder(out).heartbeat > first
    assert read_holder(out) is None


def test_the_cli_refuses_a_locked_folder_in_one_line(run, capsys):
    config, out = run
    write_lock(out, "gpu-node-7", 4242, time.time())
    argv = [
        "score",
        *config.inputs.paths,
        "--model",
        config.model.name,
        "--output",
        str(out),
        "--shard-rows",
        str(SHARD_ROWS),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dscore: error: ") and "pid 4242 on gpu-node-7" in err and len(err.splitlines()) == 1


# The fingerprint: the workload's name and options, the model, the input's identity.

PLL_RUN_KEYS = {
    "workload",
    "inputs",
    "text_column",
    "id_column",
    "shard_rows",
    "partition_column",
    "partition_by_file",
    "model",
    "revision",
    "dtype",
    "variant",
    "per_token",
    "word_scores",
    "plan",
    "input_files",
}


def test_a_pll_folder_records_what_earlier_versions_did(run, tmp_path):
    """Folders written before the options dataclasses keep resuming: same keys, split_chars only when set. A run
    that windows long texts (the default since) records `long_texts`, so that a folder of an earlier dscore,
    whose long texts are error rows, is not resumed with windowed rows: `--long-texts error` resumes it."""
    config, out = run
    recorded = json.loads((out / "_run.json").read_text())
    assert set(recorded) - set(BOOKKEEPING) == PLL_RUN_KEYS - set(BOOKKEEPING) | {"long_texts"}
    assert recorded["workload"] == "pll" and recorded["variant"] == "original" and recorded["long_texts"] == "window"
    strict = dataclasses.replace(config, scoring=ScoringOptions(long_texts="error"), output=str(tmp_path / "strict"))
    score(strict)
    recorded = json.loads((tmp_path / "strict" / "_run.json").read_text())
    assert set(recorded) - set(BOOKKEEPING) == PLL_RUN_KEYS - set(BOOKKEEPING)
    earlier = tmp_path / "strict" / "_run.json"
    with pytest.raises(UserError, match=r"differs in: long_texts; it records no long_texts: written before that"):
        score(dataclasses.replace(strict, scoring=ScoringOptions()))
    assert json.loads(earlier.read_text()) == recorded


def test_a_folder_written_before_the_bookkeeping_keys_resumes_and_records_them(run):
    """The planned shards, rows per input and outputs entered _run.json later: never compared between runs."""
    config, out = run
    recorded = json.loads((out / "_run.json").read_text())
    earlier = {k: v for k, v in recorded.items() if k not in ("shards", "rows_per_input", "outputs")}
    (out / "_run.json").write_text(json.dumps(earlier))
    (out / "summary.json").unlink()
    check_whole(out, score(config))
    assert json.loads((out / "_run.json").read_text()) == recorded


def test_each_workload_fingerprints_its_own_options_only(tmp_path):
    from distributed_scoring.engine.joint_stats import JointOptions
    from distributed_scoring.io.output import fingerprint
    from distributed_scoring.io.sources import plan_shards
    from distributed_scoring.workloads.causal import causal_workload
    from distributed_scoring.workloads.joints import joints_workload

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b\n")
    config = RunConfig(InputSpec((str(corpus),)), ModelSpec("m"), output=str(tmp_path / "out"))
    plan = plan_shards(config.inputs)
    causal = causal_workload(config.model, batch_tokens=64)
    joints = joints_workload(config.model, "x.parquet", "random", 3, JointOptions(pivot="gold"), None, 8)
    common = PLL_RUN_KEYS - {"variant", "per_token", "word_scores", "input_files"}
    assert set(fingerprint(causal.name, causal.options, config, plan)) == common
    recorded = fingerprint(joints.name, joints.options, config, plan)
    assert recorded == {
        **recorded,
        "workload": "joints-random",
        "seed": 3,
        "hcb_pivot": "gold",
        "top_k": 8,
        "ag_iterations": 50,
    }
    assert set(recorded) == common | {"seed", "hcb_pivot", "top_k", "ag_iterations"}


def test_a_folder_recording_options_this_workload_lacks_is_refused_clearly(run):
    config, out = run
    recorded = json.loads((out / "_run.json").read_text())
    (out / "_run.json").write_text(json.dumps({**recorded, "beam": 4}))
    with pytest.raises(OutputError, match="differs in: beam.*records beam 4, which this run does not set"):
        score(config)


def test_long_texts_error_into_a_windowed_folder_names_the_recorded_value(run):
    """The default (`window`) is recorded; `--long-texts error` (the earlier behaviour) is not: the refusal
    names the value the folder holds, not an older dscore."""
    config, out = run
    recorded = json.loads((out / "_run.json").read_text())
    assert recorded.get("long_texts") == "window"
    earlier = dataclasses.replace(config, scoring=dataclasses.replace(config.scoring, long_texts="error"))
    with pytest.raises(OutputError, match="records long_texts 'window', which this run does not set: an option"):
        score(earlier)
