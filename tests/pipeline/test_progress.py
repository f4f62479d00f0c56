"""Progress while a shard is scored: the display, the in-process runner, and Ray's actors through their board."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pyarrow as pa
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from distributed_scoring.io import schema as S
from distributed_scoring.pipeline import on_ray, progress, runner
from distributed_scoring.pipeline.progress import Progress, count, part, rows_done
from distributed_scoring.io.sources import plan_shards
from distributed_scoring.pipeline.runner import claimed, execute
from distributed_scoring.pipeline.stage import Stage
from distributed_scoring.pipeline.workload import Workload
from distributed_scoring.workflows.score import score

STEPS = 8  # reports of the slow stage per shard, half a second apart


def test_rows_done_and_parts():
    assert [rows_done(10, d, 4) for d in (0, 1, 2, 4, 5)] == [0, 2.5, 5, 10, 10]
    assert rows_done(1, 3, 10) == pytest.approx(0.3)  # a single row's forward passes count as they are done
    assert rows_done(10, 3, 0) == 0  # a shard with nothing to score reports nothing
    seen = []
    part(lambda done, total: seen.append((done, total)), 1, 2)(3, 4)
    assert seen == [(7, 8)]  # three quarters of the second half


def test_the_display_adds_shards_in_flight_and_never_goes_back(caplog):
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.progress")
    display = Progress(300, every_s=0, bar=False)
    display.partial("a", 50)
    display.partial("b", 30)
    assert display.shown == 80
    display.partial("a", 10)  # shard a scored again from the start (its actor died): the count stays
    assert display.shown == 80
    display.finished("a", 100)
    display.partial("a", 40)  # a late post of a shard already written counts no more
    display.finished("b", 100)
    display.finished("c", 100)
    assert display.shown == 300 and display.finished_rows == 300
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("50/300 rows (16%), ") and "rows/s, ETA " in lines[0]
    assert lines[-1].startswith("300/300 rows (100%), ") and " in 00:0" in lines[-1]


def test_counts_read_in_tenths_of_a_row_rounded_down():
    assert [count(x) for x in (0, 3, 0.35, 23.97, 1200.7, 3000)] == ["0", "3", "0.3", "23.9", "1,200", "3,000"]


def test_the_line_moves_within_a_row_and_says_what_it_waits_for_before_the_first_pass(monkeypatch):
    """The README's demo: 24 rows of about a hundred forward passes each, a row every half minute on two
    shared cores. Before the first pass the line says what it waits for and how long; then it moves on
    every pass, not on every row."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    display = Progress(24, every_s=10, bar=False, waiting="waiting for the scoring actors")
    clock[0] = 40.0
    assert display.line() == "0/24 rows (0%), waiting for the scoring actors for 00:40"
    report = display.report("a", 8)
    report(3, 100)  # 3 of a shard's 100 forward passes: 0.24 of a row
    clock[0] = 43.0
    report(30, 100)
    assert display.shown == pytest.approx(2.4)
    assert display.line().startswith("2.4/24 rows (10%), 0.72 rows/s, ETA ")


def test_the_bar_moves_within_a_row_and_says_what_it_waits_for(capsys):
    display = Progress(24, bar=True, waiting="waiting for the scoring actors")
    assert "| 0/24 " in str(display.bar) and "waiting for the scoring actors" in str(display.bar)
    display.partial("a", 0.35)
    assert "| 0.3/24 " in str(display.bar) and "waiting" not in str(display.bar)
    display.finished("a", 8)
    assert "| 8/24 " in str(display.bar)
    display.close()


def test_the_rate_leaves_start_up_out(monkeypatch):
    """100 s of start-up (model loading), then 10 rows/s: the rate is 10 rows/s and the ETA follows it."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    display = Progress(1000, every_s=0, bar=False)
    clock[0] = 100.0
    display.partial("a", 10)
    assert display.rate() == pytest.approx(0.1)  # one movement: only the rate since the start is known
    clock[0] = 110.0
    display.partial("a", 110)
    assert display.rate() == pytest.approx(10.0)
    assert "10 rows/s, ETA 01:29" in display.line()


class RecordingProgress(Progress):
    """The run's display, recording (event, shard, rows) as the pipeline feeds it."""

    runs: list[RecordingProgress] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, str, int]] = []
        RecordingProgress.runs.append(self)

    def partial(self, key: str, rows: int) -> None:
        self.events.append(("partial", key, rows))
        super().partial(key, rows)

    def finished(self, key: str, rows: int) -> None:
        self.events.append(("finished", key, rows))
        super().finished(key, rows)


@pytest.fixture
def recording(monkeypatch):
    RecordingProgress.runs = []
    monkeypatch.setattr(runner, "Progress", RecordingProgress)
    monkeypatch.setattr(on_ray, "Progress", RecordingProgress)
    return RecordingProgress.runs


def moved_before_written(events: list[tuple[str, str, int]], rows: int) -> set[str]:
    """The shards (of `rows` rows each) the display was told were part done before they were written."""
    written, moved = set(), set()
    for event, key, n in events:
        if event == "finished":
            assert n == rows
            written.add(key)
        elif key not in written and 0 < n < rows:
            moved.add(key)
    return moved


def test_in_process_the_pll_stage_moves_the_display_within_a_shard(tmp_path, tiny_model_dir, recording):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["The quick brown fox jumps over the lazy dog."] * 12) + "\n")
    config = RunConfig(InputSpec((str(corpus),), shard_rows=6), ModelSpec(str(tiny_model_dir("bert"))),
                       ScoringOptions(batch_tokens=64), str(tmp_path / "out"))
    assert score(config, progress=False)["rows"] == 12
    [display] = recording
    keys = {s.key for s in plan_shards(config.inputs)}
    assert moved_before_written(display.events, 6) == keys and display.shown == 12
    for key in keys:
        partials = [n for event, k, n in display.events if event == "partial" and k == key]
        assert partials == sorted(partials)


@dataclass(frozen=True)
class SlowOptions:
    """The fake workload's options (a run's fingerprint needs a dataclass)."""


class SlowStage(Stage):
    """Passes rows through, reporting STEPS times along the way."""

    reads = {S.ID: "kept", S.TEXT: "kept", S.STATUS: "kept", S.ERROR: "kept"}
    writes = pa.schema([pa.field(S.ID, pa.string()), pa.field(S.TEXT, pa.string()),
                        pa.field(S.STATUS, pa.string()), pa.field(S.ERROR, pa.string())])
    signature = {"model": "slow"}

    def process(self, rows):
        for step in range(1, STEPS + 1):
            time.sleep(0.5)
            self.report(step, STEPS)
        return rows


def unchanged(table: pa.Table) -> pa.Table:
    return table


def make_unchanged():
    return unchanged


@pytest.mark.ray
def test_on_ray_the_driver_sees_a_shard_move_before_it_is_written(ray_local, tmp_path, recording, caplog):
    """Two shards of 10 rows, 4 s of scoring each: the scoring actors post to the board every second
    and the driver collects every second, so it must see each shard part done before its file arrives. Two actors asked for on 6 CPUs: their CPUs are sized to fit, and the log says so."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.on_ray")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(20)))
    config = RunConfig(InputSpec((str(corpus),), shard_rows=10), ModelSpec("unused"), ScoringOptions(),
                       str(tmp_path / "out"))
    workload = Workload("slow", SlowOptions(), make_unchanged, SlowStage, "cpu")
    with claimed(config, workload) as (plan, out, todo):
        execute(workload, config, todo, out, RayOptions(num_actors=2), progress=False)
        assert out.done_keys() == {s.key for s in plan}
    [display] = recording
    assert moved_before_written(display.events, 10) == {s.key for s in plan}, display.events
    assert display.shown == 20
    assert "2 scoring actors asked for: 2.25 CPUs each fit on 1 node(s) of 6 CPUs" in caplog.text
