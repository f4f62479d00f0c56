"""Ray's out-of-memory killer during `--ray` ends the run as incomplete, quietly.

It used to end in an `OutOfMemoryError` traceback instead of the "incomplete" line, and Ray's `(raylet)
... retried` notices and an `ERROR services.py` line reached the terminal without `--verbose`. Memory is
not exhausted here: a scoring stage on the tests' shared Ray raises the exception Ray raises, and the
notices are written to file descriptor 2 as Ray's driver and processes write them.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig
from distributed_scoring.errors import DataLossError
from distributed_scoring.io import schema as S
from distributed_scoring.pipeline.ray_log import RunLog, ray_output_to, split_core_lines
from distributed_scoring.pipeline.runner import claimed, execute
from distributed_scoring.pipeline.stage import Stage
from distributed_scoring.pipeline.workload import Workload

OOM = "Task was killed due to the node running low on memory."
RAYLET = (
    b"\x1b[33m(raylet)\x1b[0m Task MapWorker(MapBatches(ScoreStage)).submit failed: "
    + OOM.encode()
    + b" It will be retried (2 of 15 retries).\n"
)
RAYLET_PLAIN = b"(raylet, ip=10.0.0.2) Task was killed due to the node running low on memory. Retrying.\n"
SERVICES = b"2026-11-24 22:44:27,107\tERROR services.py:1353 -- Failed to start the dashboard, return code -9\n"
OURS = b"2026-11-24 22:44:26,427 INFO distributed_scoring.pipeline.on_ray: running 3 shards of pll on Ray\n"
BAR = b"\r 40%|####      | 400/1000 [00:10<00:15, 40.0rows/s]"
EXIT = b"dscore: incomplete: Ray's out-of-memory killer stopped a worker of this run\n"


def route(stream: bytes, cuts: list[int]) -> tuple[bytes, bytes]:
    """(to the terminal, to the log) of `stream` fed to the router in chunks cut at `cuts`."""
    terminal, log, deciding, to_log = b"", b"", b"", None
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        routed, deciding, to_log = split_core_lines(stream[start:end], deciding, to_log)
        for logged, data in routed:
            log, terminal = (log + data, terminal) if logged else (log, terminal + data)
    return terminal + deciding, log


@pytest.mark.parametrize("cuts", [[], [1], [3, 9, 40, 41, 170], list(range(1, 700, 5)), list(range(1, 700))])
def test_the_killers_notices_go_to_the_run_log_wherever_the_reads_cut_them(cuts):
    """Also a notice printed right after the progress bar's text, which has no line end yet."""
    stream = OURS + RAYLET + BAR + RAYLET_PLAIN + SERVICES + BAR + b"\n" + EXIT
    terminal, log = route(stream, cuts)
    assert log == RAYLET + RAYLET_PLAIN + SERVICES
    assert terminal == OURS + BAR + BAR + b"\n" + EXIT


def test_while_ray_runs_its_notices_reach_the_run_log_not_the_terminal(tmp_path, capfd):
    log = RunLog()
    with ray_output_to(log):
        log.open(str(tmp_path / "dscore-driver.log"))
        for line in (RAYLET, SERVICES, EXIT):
            os.write(2, line)
    assert capfd.readouterr().err == EXIT.decode()
    written = (tmp_path / "dscore-driver.log").read_text()
    assert RAYLET.decode() in written and SERVICES.decode() in written


@dataclass(frozen=True)
class KilledOptions:
    """The fake workload's options (a run's fingerprint needs a dataclass)."""


class KilledWhileTriggered(Stage):
    """Passes rows through, except that a shard holding the row `oom:<path>` is "killed for memory" while
    that path exists."""

    reads = {S.ID: "kept", S.TEXT: "kept", S.STATUS: "kept", S.ERROR: "kept"}
    writes = S.read_schema()
    signature = {"model": "killed"}

    def process(self, rows):
        import ray

        if any(r[S.TEXT].startswith("oom:") and os.path.exists(r[S.TEXT][4:]) for r in rows):
            raise ray.exceptions.OutOfMemoryError(OOM)
        return rows


def unchanged(table: pa.Table) -> pa.Table:
    return table


def make_unchanged():
    return unchanged


def killed_workload() -> Workload:
    return Workload("killed", KilledOptions(), make_unchanged, KilledWhileTriggered, "cpu")


def corpus_with_trigger(tmp_path: Path) -> tuple[RunConfig, Path]:
    trigger = tmp_path / "low-on-memory"
    trigger.touch()
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"sentence {i}\n" for i in range(6)) + f"oom:{trigger}\n" + "last\n")
    config = RunConfig(InputSpec((str(path),), shard_rows=2), ModelSpec("unused"), output=str(tmp_path / "out"))
    return config, trigger


def run_on_ray(config: RunConfig) -> None:
    """One actor of 1 CPU: the failed run's actor lives on while pytest's log capture holds its error (and the
    traceback's frames, the executor among them) till the test ends, and the rerun's actor must still fit
    beside it in the shared Ray's CPUs."""
    workload = killed_workload()
    with claimed(config, workload) as (plan, out, todo):
        execute(
            workload, config, todo, out, RayOptions(num_actors=1, cpus_per_actor=1, stall_timeout_s=600), progress=False
        )


@pytest.mark.ray
def test_the_oom_killer_is_an_incomplete_line_and_the_rerun_resumes(tmp_path, ray_local, capsys, monkeypatch):
    from ray import cloudpickle

    from distributed_scoring.workflows import score as score_workflow

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    config, trigger = corpus_with_trigger(tmp_path)
    monkeypatch.setattr(score_workflow, "score", lambda *args, **kwargs: run_on_ray(config))
    capsys.readouterr()
    rc = main(["score", config.inputs.paths[0], "--model", "unused", "--output", config.output, "--ray"])
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("dscore: ")]  # (the shared Ray logs on its own)
    assert rc == 1
    assert line.startswith("dscore: incomplete: Ray's out-of-memory killer stopped a worker of this run")
    assert "rerun the same command to resume" in line
    done = {p.stem for p in (Path(config.output) / "_done").glob("*.json")}
    assert "00000-000000000006" not in done  # the killed shard
    trigger.unlink()  # memory freed
    run_on_ray(config)
    ids = Counter(pq.read_table(Path(config.output) / "rows", columns=[S.ID]).column(S.ID).to_pylist())
    assert set(ids) == {f"corpus.txt:{i}" for i in range(1, 9)} and set(ids.values()) == {1}


def test_the_errors_ray_raises_for_lost_workers_are_incomplete_runs():
    """The errors the killer causes besides its own (actors and workers dying) end the run the same way;
    a stage's own error wrapped by Ray arrives as itself; anything else stays a bug with its traceback."""
    import ray.exceptions as rex

    from distributed_scoring.pipeline.on_ray import WorkersLostError, plain_error

    for exc in (rex.OutOfMemoryError(OOM), rex.ActorDiedError(), rex.WorkerCrashedError()):
        assert isinstance(plain_error(exc), WorkersLostError) and isinstance(plain_error(exc), DataLossError)
    wrapped = rex.RayTaskError("write_stage", "Traceback ...", OSError(28, "No space left on device"))
    assert isinstance(plain_error(wrapped), OSError) and plain_error(wrapped).errno == 28
    bug = rex.RayTaskError("score", "Traceback ...", KeyError("id"))
    assert plain_error(bug) is bug
