"""A run's lifecycle: plan -> claim the output folder -> execute the unfinished shards -> aggregate.

Execution is either in this process (`execute_local`: read -> prepare -> score -> write per shard) or
on Ray (`pipeline.execute_ray`), over the same `Workload` stages. `score` is `dscore score`.
"""

from __future__ import annotations

import logging

from .aggregate import check_complete, summarize
from .config import RayOptions, RunConfig
from .output import OutputDir, fingerprint
from .progress import Progress
from .sources import Shard, plan_shards, read_unit, read_units
from .workloads import Workload, pll_workload

logger = logging.getLogger(__name__)


def start(config: RunConfig, workload: Workload, overwrite: bool = False) -> tuple[list[Shard], OutputDir, list[Shard]]:
    """Plan the shards and claim the output folder: (plan, folder, shards still to do)."""
    plan = plan_shards(config.inputs)
    out = OutputDir(config.output)
    done = out.start({"workload": workload.name, **workload.settings, **fingerprint(config, plan)}, overwrite)
    todo = [shard for shard in plan if shard.key not in done]
    if done:
        logger.info("resuming: %d of %d shards already done", len(plan) - len(todo), len(plan))
    return plan, out, todo


def execute_local(workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir,
                  progress: bool | None = None) -> None:
    """Read, prepare, score and write each shard in this process (one model load)."""
    scorer = workload.make_scorer()
    preparer = workload.make_preparer()
    bar = Progress(sum(s.rows for s in todo), bar=progress)
    try:
        for unit in read_units(todo):
            for shard, rows in read_unit(unit, config.inputs):
                out.write_shard(shard.key, scorer(preparer(rows)), scorer.signature)
                bar.update(shard.rows)
    finally:
        bar.close()


def execute(workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir,
            ray: RayOptions | None = None, progress: bool | None = None) -> None:
    """The unfinished shards, in this process or on Ray when `ray` options are given."""
    if not todo:
        return
    if ray is None:
        execute_local(workload, config, todo, out, progress)
    else:
        from .pipeline import execute_ray

        execute_ray(workload, config, todo, out, ray)


def run(config: RunConfig, workload: Workload, ray: RayOptions | None = None, overwrite: bool = False) -> None:
    """A workload over the corpus, then the no-loss check (for workloads with their own summary)."""
    plan, out, todo = start(config, workload, overwrite)
    execute(workload, config, todo, out, ray)
    check_complete(out, plan, workload.rows_per_input)


def score(config: RunConfig, ray: RayOptions | None = None, overwrite: bool = False,
          progress: bool | None = None) -> dict:
    """PLL of every input row; returns the summary (also written to summary.json).

    The model's configuration and tokenizer are loaded here first, so a model that cannot be used
    stops the run before any file is written (on Ray, actors would only fail later, one by one).
    """
    from .models import load_tokenizer

    load_tokenizer(config.model)
    workload = pll_workload(config.model, config.scoring)
    plan, out, todo = start(config, workload, overwrite)
    execute(workload, config, todo, out, ray, progress)
    return summarize(out, plan, config)
