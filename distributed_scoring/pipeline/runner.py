"""A run's lifecycle: plan -> claim the output folder -> execute the unfinished shards -> aggregate.

Execution is either in this process (`execute_local`: read -> prepare -> score -> write per shard) or
on Ray (`pipeline.execute_ray`), over the same `Workload` stages.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator

from .aggregate import check_complete
from ..config import InputSpec, RayOptions, RunConfig
from ..io.lock import FolderLock
from ..io.output import RUN_FILE, OutputDir, fingerprint
from .progress import Progress
from ..io.provenance import INPUT_FILES, changed_files, check_unchanged, file_identities, rows_digest
from ..io.sources import Shard, plan_shards, read_unit, read_units
from .workload import Workload

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def claimed(config: RunConfig, workload: Workload,
            overwrite: bool = False) -> Iterator[tuple[list[Shard], OutputDir, list[Shard]]]:
    """Plan the shards and hold the output folder (locked) while the body runs: (plan, folder, shards
    still to do). The lock is released when the body ends, also on error."""
    plan = plan_shards(config.inputs)
    out = OutputDir(config.output)
    identities = file_identities(plan)
    with FolderLock(out):
        run = {**fingerprint(workload.name, workload.options, config, plan), INPUT_FILES: identities}
        done = out.start(run, overwrite)
        _check_inputs(out, plan, done, config.inputs, identities)
        todo = [shard for shard in plan if shard.key not in done]
        if done:
            logger.info("resuming: %d of %d shards already done", len(plan) - len(todo), len(plan))
        yield plan, out, todo


def _check_inputs(out: OutputDir, plan: list[Shard], done: set[str], spec: InputSpec, identities: dict) -> None:
    """On resume, read again the done shards of every input whose size or mtime changed and refuse the
    run if their content did; a file only touched resumes, with its new identity recorded."""
    recorded = out.read_json(RUN_FILE)
    changed = changed_files(recorded.get(INPUT_FILES), identities)
    for path in changed:
        shards = [s for s in plan if s.file.path == path and s.key in done]
        check_unchanged(path, shards, {s.key: out.read_marker(s.key) for s in shards}, spec)
    if changed:
        out.write_json(RUN_FILE, {**recorded, INPUT_FILES: identities})


def execute_local(workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir,
                  progress: bool | None = None) -> None:
    """Read, prepare, score and write each shard in this process (one model load); the display moves
    as the score stage reports, not only when a shard is written."""
    logger.info("loading the model for %s (seconds to a few minutes, by its size)", workload.name)
    began = time.monotonic()
    scorer = workload.make_scorer()
    preparer = workload.make_preparer()
    logger.info("model loaded (%.0f s)", time.monotonic() - began)
    display = Progress(sum(s.rows for s in todo), bar=progress)
    try:
        for unit in read_units(todo):
            for shard, rows in read_unit(unit, config.inputs):
                scored = scorer(preparer(rows), display.report(shard.key, shard.rows))
                out.write_shard(shard.key, scored, scorer.signature, rows_digest(rows))
                display.finished(shard.key, shard.rows)
    finally:
        display.close()


def execute(workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir,
            ray: RayOptions | None = None, progress: bool | None = None) -> None:
    """The unfinished shards, in this process or on Ray when `ray` options are given; `progress`: a bar
    (True), log lines (False), or a bar only on an interactive terminal (None)."""
    if not todo:
        return
    if ray is None:
        execute_local(workload, config, todo, out, progress)
    else:
        from .on_ray import execute_ray

        execute_ray(workload, config, todo, out, ray, progress)


def run(config: RunConfig, workload: Workload, ray: RayOptions | None = None, overwrite: bool = False) -> None:
    """A workload over the corpus, then the no-loss check (for workloads with their own summary)."""
    with claimed(config, workload, overwrite) as (plan, out, todo):
        execute(workload, config, todo, out, ray)
        check_complete(out, plan, workload.rows_per_input)
