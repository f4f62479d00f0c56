"""Progress while a shard is scored: the display, the in-process runner, and Ray's actors through their board."""

from __future__ import annotations

import importlib
import logging
import re
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pyarrow as pa
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from distributed_scoring.io import schema as S
from distributed_scoring.io.sources import plan_shards, read_unit, read_units
from distributed_scoring.pipeline import on_ray, progress, runner
from distributed_scoring.pipeline.progress import (
    BASELINE_PASSES,
    RATE_MIN_S,
    RECENT_PASSES,
    WARM_PASSES,
    WARMING,
    Pace,
    Progress,
    count,
    part,
    rows_done,
)
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
    assert lines[0] == f"50/300 rows (16%), {WARMING}"  # one move: no rate yet
    assert lines[-1].startswith("300/300 rows (100%), ") and " rows/s in 00:0" in lines[-1]


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
    assert display.line() == f"2.4/24 rows (10%), {WARMING}"
    clock[0] = 53.0
    report(60, 100)  # 2.4 rows in the 10 s since the second pass
    assert display.line() == "4.8/24 rows (20%), 0.24 rows/s, ETA 01:20"


def test_the_bar_moves_within_a_row_and_says_what_it_waits_for(capsys):
    display = Progress(24, bar=True, waiting="waiting for the scoring actors")
    assert "| 0/24 " in str(display.bar) and "waiting for the scoring actors" in str(display.bar)
    display.partial("a", 0.35)
    assert "| 0.3/24 " in str(display.bar) and "waiting" not in str(display.bar)
    assert f", {WARMING}]" in str(display.bar)
    display.finished("a", 8)
    assert "| 8/24 " in str(display.bar)
    display.close()


def test_the_rate_leaves_start_up_and_the_first_passes_out(monkeypatch):
    """100 s of start-up (model loading), a first pass, a second (still warming up), then 10 rows/s: no rate
    until RATE_MIN_S seconds after the second pass, then 10 rows/s, and the ETA follows it."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    display = Progress(1000, every_s=0, bar=False)
    clock[0] = 100.0
    display.partial("a", 10)
    clock[0] = 110.0
    display.partial("a", 20)
    assert display.rate() is None
    clock[0] = 110.0 + RATE_MIN_S - 1
    display.partial("a", 60)
    assert display.rate() is None and display.line().endswith(WARMING)
    clock[0] = 110.0 + RATE_MIN_S
    display.partial("a", 70)
    assert display.rate() == pytest.approx(10.0)
    assert display.line().endswith("10 rows/s, ETA 01:33")


def eta_s(line: str) -> int | None:
    """The seconds of a line's `ETA [H:]MM:SS`, None without one."""
    found = re.search(r"ETA (\d+(?::\d\d)+)", line)
    if found is None:
        return None
    seconds = 0
    for field in found.group(1).split(":"):
        seconds = 60 * seconds + int(field)
    return seconds


def test_the_eta_waits_for_the_pace_after_warm_up(monkeypatch):
    """The README's demo shape: 90 s of start-up, a first forward pass of 10 s and a second of 3 s (allocations,
    lazy initialisation), then one every 0.5 s, a tenth of a row each. Every line until RATE_MIN_S seconds
    after the second pass says `ETA after warm-up`; every ETA after is the time really left (to the second).
    A rate that counted the start or the first passes in once read "ETA 23:58" for a run of 4:19."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    display = Progress(24, every_s=10, bar=False)
    report = display.report("a", 24)
    steps = [100.0, 3.0] + [0.5] * 238  # a tenth of a row each
    end, warm = sum(steps), sum(steps[:WARM_PASSES])
    for done, step in enumerate(steps[:-1], 1):
        clock[0] += step
        report(done, len(steps))
        line = display.line()
        if clock[0] < warm + RATE_MIN_S:
            assert line.endswith(WARMING), (clock[0], line)
        else:
            assert eta_s(line) == pytest.approx(end - clock[0], abs=1), (clock[0], line)


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
    config = RunConfig(
        InputSpec((str(corpus),), shard_rows=6),
        ModelSpec(str(tiny_model_dir("bert"))),
        ScoringOptions(batch_tokens=64),
        str(tmp_path / "out"),
    )
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
    writes = pa.schema(
        [
            pa.field(S.ID, pa.string()),
            pa.field(S.TEXT, pa.string()),
            pa.field(S.STATUS, pa.string()),
            pa.field(S.ERROR, pa.string()),
        ]
    )
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
    and the driver collects every second, so it must see each shard part done before its file arrives. Two actors
    asked for on 6 CPUs: their CPUs are sized to fit, and the log says so."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline")  # on_ray and the sizing in resources
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(20)))
    config = RunConfig(
        InputSpec((str(corpus),), shard_rows=10), ModelSpec("unused"), ScoringOptions(), str(tmp_path / "out")
    )
    workload = Workload("slow", SlowOptions(), make_unchanged, SlowStage, "cpu")
    with claimed(config, workload) as (plan, out, todo):
        execute(workload, config, todo, out, RayOptions(num_actors=2), progress=False)
        assert out.done_keys() == {s.key for s in plan}
    [display] = recording
    assert moved_before_written(display.events, 10) == {s.key for s in plan}, display.events
    assert display.shown == 20
    assert "2 scoring actors asked for: 2.25 CPUs each fit on 1 node(s) of 6 CPUs" in caplog.text


# The pace of the forward passes: a run whose passes collapse against its first ones says so once.


def paced(seconds: list[float], threads: int | None = 2) -> list[str]:
    """The warnings of a `Pace` told of forward passes of `seconds` each."""
    said: list[str] = []
    pace = Pace(said.append, threads, "do this")
    for s in seconds:
        pace.passed(s)
    return said


def test_the_pace_warns_once_when_the_forward_passes_collapse():
    warm, first = [3.0, 1.0], [0.1] * BASELINE_PASSES  # the first passes load and allocate: not the baseline
    assert paced(warm + first + [0.6] * (RECENT_PASSES - 1)) == []  # not yet RECENT_PASSES slow ones
    [said] = paced(warm + first + [0.6] * RECENT_PASSES + [0.9] * 20)
    assert said.startswith("forward passes now take 6x as long as this run's first ones (0.6 s against 0.1 s)")
    assert "torch's 2 threads here wait for each other" in said and said.endswith("; do this")
    [alone] = paced(warm + first + [0.6] * RECENT_PASSES, threads=1)
    assert "fewer threads will not help" in alone and "do this" not in alone


def test_the_pace_stays_quiet_at_a_steady_pace_with_spikes_and_slow_starts():
    steady = [0.1, 0.45, 0.1, 2.0, 0.1] * 10  # 4.5x and 20x spikes, never most of the latest passes
    assert paced([0.1] * (WARM_PASSES + BASELINE_PASSES) + steady) == []
    assert paced([9.0] * WARM_PASSES + [0.1] * BASELINE_PASSES + [0.4] * 50) == []  # 4x: below the ratio
    assert paced([0.5] * WARM_PASSES + [0.5] * BASELINE_PASSES + [0.1] * 50) == []  # faster is no news


def test_a_watched_report_times_each_pass_of_its_shard_from_the_watch(monkeypatch):
    """A shard's first pass is timed from its watch, the next ones from the pass before; the time between
    two shards (reading, writing) is no forward pass."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    seen, timed = [], []
    pace = Pace(lambda message: None, 1, "")
    monkeypatch.setattr(pace, "passed", timed.append)
    for shard, steps in (("a", (0.5, 0.25)), ("b", (2.0,))):
        clock[0] += 100  # between shards
        report = pace.watch(lambda done, total, shard=shard: seen.append((shard, done, total)))
        for i, step in enumerate(steps, 1):
            clock[0] += step
            report(i, len(steps))
    assert seen == [("a", 1, 2), ("a", 2, 2), ("b", 1, 1)]
    assert timed == [0.5, 0.25, 2.0]


def test_the_display_says_a_warning_once(caplog):
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.progress")
    display = Progress(10, bar=False)
    display.warn("slow")
    display.warn("slow, from another actor")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", "slow")]


CLOCK = [0.0]  # the fake clock of the paced stage below


class PacedStage(Stage):
    """Passes rows through after 10 forward passes of a fake clock: 0.1 s each on rows saying "fast",
    1 s on rows saying "slow"."""

    reads, writes, signature = SlowStage.reads, SlowStage.writes, {"model": "paced"}

    def process(self, rows):
        step = 1.0 if rows[0][S.TEXT].startswith("slow") else 0.1
        for done in range(1, 11):
            CLOCK[0] += step
            self.report(done, 10)
        return rows


def test_in_process_a_run_whose_passes_collapse_says_so_once_with_what_to_do(tmp_path, monkeypatch, caplog):
    """One shard at 0.1 s a forward pass, then two at 1 s, with torch on 2 threads: one warning, naming the
    threads and the fix."""
    importlib.import_module("torch")  # as a scorer that brought torch: the run then sizes torch's threads
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: CLOCK[0]))
    monkeypatch.setattr(runner, "set_torch_threads", lambda: 2)  # as on 2 free CPUs; this process's threads kept
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"fast {i}\n" for i in range(5)) + "".join(f"slow {i}\n" for i in range(10)))
    config = RunConfig(
        InputSpec((str(corpus),), shard_rows=5), ModelSpec("unused"), ScoringOptions(), str(tmp_path / "out")
    )
    workload = Workload("paced", SlowOptions(), make_unchanged, PacedStage, "cpu")
    with claimed(config, workload) as (plan, out, todo):
        execute(workload, config, todo, out, progress=False)
        assert out.done_keys() == {s.key for s in plan}
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("forward passes now take 10x as long as this run's first ones (1 s against 0.1 s)")
    assert "torch's 2 threads here wait for each other" in warning
    assert warning.endswith(runner.FEWER_THREADS) and "OMP_NUM_THREADS=1" in warning


def test_in_process_torch_runs_on_the_usable_cpus_unless_omp_num_threads_is_set(tmp_path, tiny_model_dir, monkeypatch):
    import torch

    from distributed_scoring import cpus

    before = torch.get_num_threads()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A short sentence.\n")
    model = ModelSpec(str(tiny_model_dir("bert")))
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0}, raising=False)  # one CPU of this machine's
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(3)
        score(RunConfig(InputSpec((str(corpus),)), model, ScoringOptions(), str(tmp_path / "set")), progress=False)
        assert torch.get_num_threads() == 3  # the user's choice
        monkeypatch.delenv("OMP_NUM_THREADS")
        score(RunConfig(InputSpec((str(corpus),)), model, ScoringOptions(), str(tmp_path / "unset")), progress=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


class Board:
    """A `ProgressBoard` handle's stand-in in this process: `board.post.remote(...)` records."""

    def __init__(self) -> None:
        self.posts, self.warnings = [], []
        self.post = SimpleNamespace(remote=lambda key, rows: self.posts.append((key, rows)))
        self.warn = SimpleNamespace(remote=self.warnings.append)


def test_a_scoring_actors_collapse_goes_to_the_board(tmp_path, monkeypatch):
    """A scoring actor's stage, here in this process with a stand-in board: 2 shards at 0.1 s a pass, then
    3 at 1 s; the board is told once, with the fix that fits Ray."""
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: CLOCK[0]))
    monkeypatch.setattr(on_ray, "set_torch_threads", lambda asked: asked)  # as on free CPUs; this process's kept
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("fast\nfast\nslow\nslow\nslow\n")
    spec = InputSpec((str(corpus),), shard_rows=1)
    board = Board()
    stage = on_ray.ScoreStage(Workload("paced", SlowOptions(), make_unchanged, PacedStage, "cpu"), 2, board)
    for unit in read_units(plan_shards(spec)):
        for shard, rows in read_unit(unit, spec):
            stage(on_ray.payload(shard.to_json(), rows, digest="-"))
    [warning] = board.warnings
    assert "10x as long" in warning and "torch's 2 threads" in warning and warning.endswith(on_ray.FEWER_THREADS)


@pytest.mark.ray
def test_a_ray_actor_of_one_cpu_runs_one_torch_thread_and_its_warning_reaches_the_display(ray_local, caplog):
    """The scoring actor asks for 4 threads on a Ray of 6 CPUs (2 cores): Ray gave it 1 CPU, so torch runs 1
    thread (the node's cores alone would allow 2). A warning posted to the board is said once by the driver."""
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    caplog.set_level(logging.INFO, "distributed_scoring.pipeline.progress")
    workload = Workload("slow", SlowOptions(), make_unchanged, SlowStage, "cpu")
    actor = ray.remote(num_cpus=1)(on_ray.ScoreStage).remote(workload, 4)
    board = ray.remote(num_cpus=0)(on_ray.ProgressBoard).remote()
    try:
        assert ray.get(actor.__ray_call__.remote(lambda stage: __import__("torch").get_num_threads())) == 1
        ray.get([board.warn.remote("slow down"), board.warn.remote("slow down, from another actor")])
        display = Progress(10, bar=False)
        collect = on_ray._collector(board, display)
        deadline = time.monotonic() + 60
        while not display.warned and time.monotonic() < deadline:
            collect()
            time.sleep(0.1)
    finally:
        ray.kill(actor)
        ray.kill(board)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == ["slow down"]
