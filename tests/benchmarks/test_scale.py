"""The scale harness's own code (benchmarks/scale.py, scale_stages.py, scale_report.py): the no-op workload
through both executions, the plan, the kill-at-half-way resume measurement, rescoring's steps and the
tables. Nothing here is timed."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig  # noqa: E402
from distributed_scoring.io import schema as S  # noqa: E402
from distributed_scoring.pipeline.aggregate import summarize  # noqa: E402
from distributed_scoring.pipeline.runner import claimed, execute  # noqa: E402

import scale  # noqa: E402
import scale_report  # noqa: E402
import scale_stages  # noqa: E402

TEXTS = ["The quick brown fox.", "", "Two  words", "one"]


def corpus(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"".join(line.encode() + b"\n" for line in lines) + b"\xff not utf-8\n")
    return path


def noop_run(
    tmp_path: Path,
    options: scale_stages.NoopOptions,
    ray: RayOptions | None = None,
    memory: Path | None = None,
    shard_rows: int = 2,
) -> tuple[dict, pa.Table]:
    config = RunConfig(
        InputSpec((str(corpus(tmp_path, TEXTS)),), shard_rows=shard_rows),
        ModelSpec("noop"),
        output=str(tmp_path / "out"),
    )
    workload = scale_stages.noop_workload(options)
    if memory is not None:
        workload = scale_stages.recorded(workload, str(memory))
    with claimed(config, workload) as (plan, out, todo):
        execute(workload, config, todo, out, ray, progress=False)
        summary = summarize(out, plan, config)
    return summary, pq.read_table(tmp_path / "out" / "rows")


@pytest.mark.parametrize("per_token", [False, True])
def test_noop_workload_keeps_every_row_with_the_pll_schema_and_zero_scores(tmp_path, per_token):
    summary, table = noop_run(tmp_path, scale_stages.NoopOptions("zero", per_token))
    assert table.schema == S.output_schema(per_token=per_token)
    rows = {r[S.ID]: r for r in table.to_pylist()}
    assert summary["rows"] == len(rows) == 5 and summary["errors"] == 1
    assert rows["corpus.txt:5"][S.STATUS] == S.STATUS_ERROR and rows["corpus.txt:5"][S.PLL] is None
    for i, text in enumerate(TEXTS, start=1):
        row = rows[f"corpus.txt:{i}"]
        assert row[S.STATUS] == S.STATUS_OK and row[S.PLL] == 0.0
        assert row[S.N_TOKENS] == row[S.N_WORDS] == len(text.split())
        if per_token:
            assert row[S.TOKENS] == text.split() and row[S.TOKEN_LOGPROBS] == [0.0] * len(text.split())


def test_hash_scores_are_log_probabilities_fixed_by_the_row_id(tmp_path):
    options = scale_stages.NoopOptions("hash", per_token=True)
    _, table = noop_run(tmp_path, options)
    for row in table.to_pylist():
        if row[S.STATUS] != S.STATUS_OK:
            continue
        logprobs = row[S.TOKEN_LOGPROBS]
        assert all(lp <= 0.0 for lp in logprobs)
        assert row[S.PLL] == pytest.approx(sum(logprobs), abs=1e-12)
        assert logprobs == scale_stages.word_logprobs(row[S.ID], len(logprobs), options).tolist()
    other = scale_stages.word_logprobs("corpus.txt:1", 4, scale_stages.NoopOptions("hash", seed=1))
    assert other.tolist() != scale_stages.word_logprobs("corpus.txt:1", 4, options).tolist()


@pytest.mark.ray
def test_noop_workload_on_ray_records_the_actors_own_peak_memory(ray_local, tmp_path):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(scale_stages)  # the shared test Ray's workers lack benchmarks/ on their path
    memory = tmp_path / "memory"
    memory.mkdir()
    summary, table = noop_run(
        tmp_path, scale_stages.NoopOptions(), RayOptions(num_actors=1, stall_timeout_s=300), memory
    )
    assert summary["rows"] == table.num_rows == 5
    records = [json.loads(p.read_text()) for p in memory.glob("*.json")]
    assert {r["role"] for r in records} == {"prepare", "score"}
    assert os.getpid() not in {r["pid"] for r in records}
    peaks = scale_stages.actor_peaks(str(memory), os.getpid())
    assert all(peaks[role] > 10_000 for role in ("prepare", "score"))  # a Python process holds more than 10 MB


def test_peak_memory_is_this_process_own_and_grows(tmp_path):
    before = scale_stages.peak_rss_kb()
    block = bytearray(64 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert scale_stages.peak_rss_kb() >= before + 60 * 1024
    del block


def record(spec: scale.Spec, status: str, timeout_s: float = 60.0, result: dict | None = None) -> dict:
    rec = {
        "key": spec.key,
        "spec": scale.asdict(spec),
        "status": status,
        "timeout_s": timeout_s,
        "wall_s": 1.0,
        "load_start": [0.1, 0.1, 0.1],
        "load_end": [0.2, 0.2, 0.2],
        "settings": {"threads": 1, "shard_rows": 2},
        "machine": {"cpu": "cpu", "logical_cores": 2, "python": "3", "versions": {"torch": "2"}},
    }
    if result is not None:
        rec["result"] = result
    return rec


def test_plan_resumes_only_runs_with_enough_shards_and_caps_the_model():
    specs = scale.plan(
        [10_000, 1000],
        ["noop", "tiny"],
        ["in-process", "ray-2"],
        scale.KINDS,
        model_max=1000,
        shard_rows=1000,
        many_files=5,
        large_gb=0.001,
    )
    keys = [s.key for s in specs]
    assert len(keys) == len(set(keys))
    assert [s.n for s in specs if s.kind == "run"] == sorted(s.n for s in specs if s.kind == "run")
    assert {s.n for s in specs if s.kind == "run" and s.scorer == "tiny"} == {1000}
    assert {s.n for s in specs if s.kind == "resume"} == {10_000}
    assert {(s.mode, s.n, s.files) for s in specs if s.kind == "many-files"} == {
        ("in-process", 5 * scale.ROWS_PER_SMALL_FILE, 5),
        ("ray-2", 5 * scale.ROWS_PER_SMALL_FILE, 5),
    }
    assert [s.n for s in specs if s.kind == "large-file"] == [int(0.001 * 1e9) // scale.LARGE_LINE_BYTES]


def test_new_markers_tells_a_marker_written_after_the_start(tmp_path):
    done = tmp_path / "_done"
    done.mkdir()
    (done / "old.json").write_text("{}")
    markers = scale.NewMarkers(str(tmp_path))
    started = time.time_ns()
    assert markers.first_after(started) is None
    time.sleep(0.05)
    (done / "new.json").write_text("{}")
    seconds = markers.first_after(started)
    assert seconds is not None and 0.0 < seconds < 5.0


def resume_measurement(tmp_path: Path) -> tuple[dict, Path]:
    """The resume measurement of 4,000 rows in 20 shards, and its scratch folder."""
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    spec = scale.Spec("resume", "noop", "in-process", 4000)
    settings = scale.Settings(str(corpora), threads=1, shard_rows=200, tiny_model=None)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert scale.prepare(spec, corpora, scratch) is None
    return scale.measure_resume(spec, settings, scratch), scratch


def check_killed_at_half_way(result: dict, scratch: Path) -> None:
    rerun = result["rerun"]
    assert result["shards"] == 20 and result["killed"]
    assert result["marked_at_kill"] == 10 and rerun["todo_shards"] == 10
    assert rerun["rows"] == 4000 and rerun["first_marker_s"] > 0
    ids = pq.read_table(scratch / "out" / "rows", columns=[S.ID]).column(S.ID).to_pylist()
    assert len(ids) == len(set(ids)) == 4000


def test_resume_measurement_kills_at_half_way_and_the_rerun_does_the_rest(tmp_path):
    check_killed_at_half_way(*resume_measurement(tmp_path))


def test_resume_measurement_kills_at_half_way_however_late_the_harness_looks(tmp_path, monkeypatch):
    """On a busy machine the harness may look at the markers only after the run has gone past half way:
    `make test-fast` once found all 20 shards marked at the kill, and the rerun, with nothing to do, had no
    first marker (None > 0). Here the harness's first look waits until the run can go no further (every
    shard marked, or the run holding at half way, as its log says): the kill still finds 10."""
    counted = scale.markers
    log = tmp_path / "scratch" / "killed.log"  # the killed run's output (`run_in_child`)

    def late(output: Path) -> int:
        deadline = time.monotonic() + 120
        while counted(output) < 20 and "holding after" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        return counted(output)

    monkeypatch.setattr(scale, "markers", late)
    check_killed_at_half_way(*resume_measurement(tmp_path))


def test_rescore_measurement_counts_what_rescoring_saw(tmp_path):
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    spec = scale.Spec("rescore", "noop", "in-process", 400)
    scale.prepare(spec, corpora, tmp_path)
    result = scale.measure_rescore(spec, scale.Settings(str(corpora), 1, 100, None), tmp_path)
    assert result["hypotheses"] == 400 and result["utterances"] == 40
    assert 0 < result["unique_texts"] <= 400 and result["grid_points"] >= 21
    assert result["dev"]["hypotheses"] == 200
    steps = ("read_dedupe_s", "write_texts_s", "scoring_s", "join_s", "tuning_s", "write_s")
    assert all(result[s] >= 0 for s in steps)
    assert result["after_scoring_s"] == pytest.approx(result["join_s"] + result["tuning_s"] + result["write_s"])


def test_every_table_row_has_the_header_cells_whatever_the_status(tmp_path):
    """Finished and unfinished measurements of every kind render with as many cells as their header."""
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    path = scale.sentence_corpus(corpora, 50)
    run = scale.run_job(scale.RunJob((str(path),), str(tmp_path / "out"), str(tmp_path / "memory"), shard_rows=20))
    specs = [scale.Spec(kind, "noop", "in-process", 50) for kind in scale.KINDS]
    all_done = {
        "shards": 3,
        "killed": True,
        "killed_after_s": 1.0,
        "marked_at_kill": 3,
        "rerun": {**run, "todo_shards": 0, "first_marker_s": None},
    }  # killed too late: nothing new
    records = [
        record(specs[0], "ok", result=run),
        *(record(s, "timeout") for s in specs[1:]),
        record(scale.Spec("resume", "noop", "ray-1", 50), "ok", result=all_done),
        record(scale.Spec("run", "noop", "ray-2", 50), "failed"),
        record(scale.Spec("large-file", "noop", "in-process", 9), "skipped", result={"skipped": "no room"}),
    ]
    text = scale_report.markdown(records, records[0]["machine"])
    tables = [block.splitlines() for block in text.split("\n\n") if block.startswith("| ")]
    assert len(tables) == 5
    for lines in tables:
        assert len({line.count("|") for line in lines}) == 1, lines
    assert "timed out after 60 s" in text and "no room" in text
    assert scale_report.plot(records, tmp_path / "scale.png").stat().st_size > 0


def test_many_files_measurement_makes_one_shard_per_small_file(tmp_path):
    corpora = tmp_path / "corpora"
    corpora.mkdir()
    spec = scale.Spec("many-files", "noop", "in-process", 5 * scale.ROWS_PER_SMALL_FILE, files=5)
    scale.prepare(spec, corpora, tmp_path)
    result = scale.measure(spec, scale.Settings(str(corpora), 1, 1000, None), tmp_path)
    assert result["rows"] == 50 and result["shards"] == 5
    assert result["input_bytes"] == scale.folder_size(corpora / "many-5")[1] > 0
    assert result["files_written"] == 2 * 5 + 2  # a Parquet file and a marker per shard, _run.json, summary.json


def test_model_runs_score_with_the_pll_workload_and_record_the_driver(tmp_path, tiny_model_dir):
    path = tmp_path / "corpus.txt"
    path.write_text("The quick brown fox jumps.\nA researcher rescored the hypotheses.\n")
    job = scale.RunJob(
        (str(path),),
        str(tmp_path / "out"),
        str(tmp_path / "memory"),
        scorer="tiny",
        model=str(tiny_model_dir("bert")),
        shard_rows=1,
    )
    result = scale.run_job(job)
    assert result["rows"] == 2 and result["shards"] == 2 and result["first_marker_s"] > 0
    assert result["driver_peak_rss_kb"] >= result["driver_rss_start_kb"] > 0
    assert result["actor_peak_rss_kb"] == {}  # in process: the stages ran in the driver
    table = pq.read_table(tmp_path / "out" / "rows")
    assert table.column(S.PLL).null_count == 0 and set(table.column(S.MODEL).to_pylist()) == {job.model}
