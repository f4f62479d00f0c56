"""A run's lifecycle: plan -> claim the output folder -> execute the unfinished shards -> aggregate.

`run` is every command's run: it claims, executes, checks that no row was lost, and hands the finished run
(`Finished`) to the command's own summary step, whose summary it writes, then to its report. `claimed` and
`execute` are its parts, for a caller that times them apart (the benchmarks). Execution is either in this
process (`execute_local`: read -> prepare -> score -> write per shard) or on Ray (`on_ray.execute_ray`),
over the same `Workload` stages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from ..config import InputSpec, RayOptions, RunConfig
from ..cpus import set_torch_threads, usable_cpus
from ..errors import DataLossError
from ..io import schema as S
from ..io.claim import Claim, check_paths, claim
from ..io.ids import check_unique_ids
from ..io.output import ROW_KEY, ROWS_PER_INPUT, SHARDS, SUMMARY_FILE, OutputDir, fingerprint
from ..io.provenance import INPUT_FILES, changed_files, check_unchanged, file_identities, rows_digest
from ..io.sources import Shard, read_unit, read_units
from ..io.storage import error_reason
from ..stopping import Stopped
from .aggregate import complete_markers
from .progress import Pace, Progress
from .sizing import sized_plan
from .workload import Workload

logger = logging.getLogger(__name__)

FEWER_THREADS = "on a shared machine, run the command with OMP_NUM_THREADS=1"  # in process (see progress.Pace)


@contextlib.contextmanager
def claimed(
    config: RunConfig,
    workload: Workload,
    overwrite: bool = False,
    outputs: tuple[str, ...] = (),
    folder: Claim | None = None,
    ray: RayOptions | None = None,
) -> Iterator[tuple[list[Shard], OutputDir, list[Shard]]]:
    """Plan the shards and hold the output folder (locked) while the body runs: (plan, folder, shards
    still to do). The lock is released when the body ends, also on error. `outputs`: the files the body
    writes beside the shards (recorded for --overwrite and `dscore verify`). `folder`: the output folder
    when the command holds it already (it writes there before or after the run). `ray`: the run's Ray,
    started here when the shards are sized for its scoring actors (`fit_actors`)."""
    with contextlib.ExitStack() as stack:
        config, plan = sized_plan(config, workload, ray, overwrite, stack)
        check_unique_ids(plan, config.inputs)  # before the folder is touched and any shard scored
        yield from _claimed(config, workload, plan, overwrite, outputs, folder)


def _claimed(
    config: RunConfig,
    workload: Workload,
    plan: list[Shard],
    overwrite: bool,
    outputs: tuple[str, ...],
    folder: Claim | None,
) -> Iterator[tuple[list[Shard], OutputDir, list[Shard]]]:
    inputs = [*config.inputs.paths, *dict.fromkeys(s.file.path for s in plan)]
    with _holding(config, inputs, folder) as folder:
        identities = file_identities(plan)
        run = {
            **fingerprint(workload.name, workload.options, config, plan),
            INPUT_FILES: identities,
            SHARDS: {s.key: s.rows for s in plan},
            ROWS_PER_INPUT: workload.rows_per_input,
            ROW_KEY: row_key(workload, config.inputs),
        }
        previous = folder.admit(run, overwrite)
        out = folder.out
        if previous is None:  # _run.json first: a folder with rows/ but no _run.json would be no run's
            folder.begin(run, previous, outputs)
            done = out.open_shards()
        else:  # the inputs are checked against what the folder recorded, before _run.json is rewritten
            done = out.open_shards()
            _check_inputs(out, plan, done, config.inputs, previous.get(INPUT_FILES), identities)
            folder.begin(run, previous, outputs)
        todo = [shard for shard in plan if shard.key not in done]
        if done and not todo:
            logger.info("%s", already_complete(len(plan)))
        elif done:
            logger.info("resuming: %d of %d shards already done", len(plan) - len(todo), len(plan))
        try:
            yield plan, out, todo
        except Stopped as stop:  # SIGTERM, Ctrl-C: say how far the run got (the innermost run, for sub-runs)
            if stop.shards is None:
                with contextlib.suppress(OSError):
                    stop.shards = (len(set(out.marker_keys()) & {s.key for s in plan}), len(plan))
            raise
        except OSError as exc:  # a full disk, a lost mount: on Ray too, whose task errors arrive as they were
            raise DataLossError(
                f"the run stopped on an error while writing {out.uri} ({_os_reason(exc)}); the shards finished "
                "before it are kept: free space (or fix the storage), then rerun the same command to finish"
            ) from exc


def already_complete(shards: int) -> str:
    """What a rerun of a finished run says: nothing is scored again."""
    every = "its one shard was" if shards == 1 else f"all {shards} of its shards were"
    return f"already complete: {every} scored before; nothing to score"


def row_key(workload: Workload, inputs: InputSpec) -> list[str]:
    """The columns that key the run's rows (`dscore verify` reads them from `_run.json`): `id`, those the
    workload declares, and `line` when ids may repeat (`--allow-duplicate-ids`)."""
    return [S.ID, *workload.row_key, *([S.LINE] if inputs.allow_duplicate_ids else [])]


def _os_reason(exc: OSError) -> str:
    """What went wrong, as the system names it (`No space left on device`) and where, when that is known: Ray
    Data appends its retry advice to a task's error, and pyarrow wraps the system's words in its own."""
    if not exc.errno:
        return error_reason(exc)
    where = exc.filename if isinstance(exc.filename, str) and "\n" not in exc.filename else None
    return os.strerror(exc.errno) + (f": {where}" if where else "")


def _holding(config: RunConfig, inputs: list[str], folder: Claim | None) -> contextlib.AbstractContextManager[Claim]:
    """The claim of the run's output folder: a new one, or `folder` (held by the command already, whose
    own files among the inputs, generated prompts, are no mistake)."""
    if folder is None:
        return claim(config.output, inputs, [config.model.name])
    check_paths(config.output, inputs, [config.model.name], own=folder.written)
    return contextlib.nullcontext(folder)


def _check_inputs(
    out: OutputDir, plan: list[Shard], done: set[str], spec: InputSpec, recorded: dict | None, identities: dict
) -> None:
    """On resume, read again the done shards of every input whose size or mtime differs from what the
    folder `recorded` and refuse the run if their content did; a file only touched resumes (its new
    identity is recorded with the run)."""
    for path in changed_files(recorded, identities):
        shards = [s for s in plan if s.file.path == path and s.key in done]
        check_unchanged(path, shards, {s.key: out.read_marker(s.key) for s in shards}, spec)


def execute_local(
    workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir, progress: bool | None = None
) -> None:
    """Read, prepare, score and write each shard in this process (one model load); the display moves
    as the score stage reports, not only when a shard is written, and says so should the forward passes
    slow down. A scorer that brought torch runs it on the CPUs this process really has (`cpus`), unless
    OMP_NUM_THREADS says otherwise."""
    logger.info("loading the model for %s (seconds to a few minutes, by its size)", workload.name)
    began = time.monotonic()
    scorer = workload.make_scorer()
    preparer = workload.make_preparer()
    logger.info("model loaded (%.0f s)", time.monotonic() - began)
    threads = set_torch_threads() if "torch" in sys.modules else None
    if threads is not None:
        logger.info(
            "torch runs %d thread%s (%d usable CPUs%s)",
            threads,
            "s" * (threads > 1),
            usable_cpus(),
            ", OMP_NUM_THREADS set" if os.environ.get("OMP_NUM_THREADS") else "",
        )
    display = Progress(sum(s.rows for s in todo), bar=progress)
    pace = Pace(display.warn, threads, FEWER_THREADS)
    try:
        for unit in read_units(todo):
            for shard, rows in read_unit(unit, config.inputs):
                prepared = preparer(rows)
                scored = scorer(prepared, pace.watch(display.report(shard.key, shard.rows)))
                out.write_shard(shard.key, scored, scorer.signature, rows_digest(rows))
                display.finished(shard.key, shard.rows)
    finally:
        display.close()


def execute(
    workload: Workload,
    config: RunConfig,
    todo: list[Shard],
    out: OutputDir,
    ray: RayOptions | None = None,
    progress: bool | None = None,
) -> None:
    """The unfinished shards, in this process or on Ray when `ray` options are given; `progress`: a bar
    (True), log lines (False), or a bar only on an interactive terminal (None)."""
    if not todo:
        return
    if ray is None:
        execute_local(workload, config, todo, out, progress)
    else:
        from .on_ray import execute_ray

        execute_ray(workload, config, todo, out, ray, progress)


@dataclass(frozen=True)
class Finished:
    """A run whose every planned shard is written and checked, as its command's summary step sees it: what ran
    (`config`, `workload`, the `plan`), where (`out`), the shards this call ran (`todo`) in how many `seconds`,
    and the planned shards' checked markers (`markers`: rows, signature and the figures a summary adds up)."""

    config: RunConfig
    workload: Workload
    plan: list[Shard]
    out: OutputDir
    todo: list[Shard]
    seconds: float
    markers: dict[str, dict]

    @property
    def rows_now(self) -> int:
        """The output rows this call wrote (not those of the shards an earlier run finished)."""
        return sum(s.rows for s in self.todo) * self.workload.rows_per_input


def run(
    config: RunConfig,
    workload: Workload,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    *,
    progress: bool | None = None,
    folder: Claim | None = None,
    summarise: Callable[[Finished], dict] | None = None,
    report: Callable[[OutputDir, dict], None] | None = None,
    outputs: tuple[str, ...] = (),
) -> dict | None:
    """Every command's run: claim the folder (`folder`, when the command holds it already), execute the
    unfinished shards (on Ray when `ray` options are given; `progress` as in `execute`), check that every
    planned row was written once, then `summarise` the finished run into summary.json and `report` it in
    `outputs`, the files it writes beside (report.md, a plot). Returns the summary; None without `summarise`
    (a sub-run whose rows the command reads itself)."""
    written = ((SUMMARY_FILE,) if summarise is not None else ()) + outputs
    with claimed(config, workload, overwrite, written, folder, ray) as (plan, out, todo):
        began = time.perf_counter()
        execute(workload, config, todo, out, ray, progress)
        seconds = time.perf_counter() - began
        markers = complete_markers(out, plan, workload.rows_per_input)
        if summarise is None:
            return None
        summary = summarise(Finished(config, workload, plan, out, todo, seconds, markers))
        out.write_json(SUMMARY_FILE, summary)
        if report is not None:
            report(out, summary)
        return summary
