"""How big a run's shards are: by estimated work when --shard-rows is not given, so that a stop loses at most
about `SHARD_SECONDS` of scoring, whatever a row costs.

A shard is the unit of resume: a stop keeps every finished shard and loses the one in flight. At a fixed
1,000 rows, a shard of short sentences under a single pass is a second on a GPU, and one of 100-residue
chains under the PLL is over an hour on two CPU cores. So when the workload says what a row costs
(`Workload.row_cost`: forward passes per token and per row, FLOPs per position, bytes per token), the shard's
budget is `SHARD_SECONDS` of the device that scores it at a conservative rate (`CPU_FLOPS_PER_THREAD` per
torch thread, `GPU_FLOPS` per GPU), and the planner cuts each file where the next record would pass it
(`io.sources.base.ShardCutter`), at most `shard_rows` records a shard. The budget and the row cost are
recorded in `_run.json` (`shard_cost`), and a rerun takes them from there: it cuts the same shards on any
machine, and resumes them.

On Ray, with every scoring actor wanting a shard, a corpus of few shards is cut finer (`fit_actors`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from pathlib import Path

import pyarrow.compute as pc

from ..config import InputSpec, RayOptions, RunConfig, ShardCost
from ..cpus import usable_cpus
from ..errors import UserError
from ..io import schema as S
from ..io.output import RUN_FILE, OutputDir
from ..io.sources import Shard, plan_shards, read_unit, read_units
from .workload import Workload

logger = logging.getLogger(__name__)

SHARD_SECONDS = 30.0  # the scoring a stop may lose, by the estimate below
SAMPLE_ROWS = 200  # the input's first rows, tokenised to measure its bytes per token
# Rates below what the cores reach with a model of the demo's size (benchmarks/RESULTS.md, "Stops"): an
# estimate too high makes shards too long, which is what a stop pays for; one too low only makes more shards.
CPU_FLOPS_PER_THREAD = 4e10
GPU_FLOPS = 5e13  # a fifth of an H100's dense bf16 peak: what a PLL's short sequences reach, roughly


def sized_plan(
    config: RunConfig, workload: Workload, ray: RayOptions | None, overwrite: bool, stack: contextlib.ExitStack
) -> tuple[RunConfig, list[Shard]]:
    """The run's config and shard plan. With --shard-rows given (`fit_actors` off), shards of that many rows.
    Otherwise the sizes a folder's earlier run of these inputs recorded (a rerun resumes its shards), else by
    the workload's `row_cost` on the device that scores, then, on Ray (started here, in `stack`, to count
    the scoring actors), cut finer until every actor has a shard."""
    spec = config.inputs
    if not spec.fit_actors:
        return config, plan_shards(spec)
    recorded = None if overwrite else _recorded(config.output, workload.name, spec)
    if recorded is not None:
        config = _with(config, shard_rows=recorded[0], cost=recorded[1])
        return config, plan_shards(config.inputs)
    resources = None
    if ray is not None:
        from .cluster import cluster_address, ray_session
        from .resources import plan_when_ready

        stack.enter_context(ray_session(ray))
        resources = plan_when_ready(ray, workload.device, cluster_address(ray.address) is not None)
    plan = plan_shards(spec)
    if workload.row_cost is not None and plan:
        if resources is None:
            flops = _local_flops(workload.device)
        else:
            flops = GPU_FLOPS if resources.gpus_per_actor else CPU_FLOPS_PER_THREAD * resources.threads_per_actor
        cost = ShardCost(workload.row_cost, _bytes_per_token(plan, spec, workload), SHARD_SECONDS * flops)
        config = _with(config, cost=cost)
        plan = plan_shards(config.inputs)
        _log_cost(config.inputs, plan)
    if resources is None:
        return config, plan
    return _fitted(config, plan, resources.actors)


def _fitted(config: RunConfig, plan: list[Shard], actors: int) -> tuple[RunConfig, list[Shard]]:
    """The plan cut finer (fewer rows a shard) when it leaves a scoring actor without a shard."""
    rows = sum(s.rows for s in plan)
    if len(plan) >= actors or rows <= len(plan):
        return config, plan
    before = config.inputs.shard_rows
    config = _with(config, shard_rows=max(1, math.ceil(rows / actors)))
    plan = plan_shards(config.inputs)
    logger.info(
        "%d rows in %d shards of up to %d rows, so that each of the %d scoring actors has one (%d rows a shard "
        "would make fewer; --shard-rows sets it)",
        rows,
        len(plan),
        config.inputs.shard_rows,
        actors,
        before,
    )
    return config, plan


def _bytes_per_token(plan: list[Shard], spec: InputSpec, workload: Workload) -> float:
    """Bytes of text per token on the first `SAMPLE_ROWS` rows of the input, as the workload's own prepare
    stage tokenises them (specials left out); 1 where none of them is scored, as a character-level tokenizer
    has it, which errs toward short shards."""
    _, rows = next(read_unit(read_units(plan)[0], spec))
    rows = rows.slice(0, SAMPLE_ROWS)
    prepared = workload.make_preparer()(rows)
    if S.INPUT_IDS not in prepared.column_names:
        return 1.0
    ok = pc.equal(prepared[S.STATUS], S.STATUS_OK)
    tokens = pc.sum(pc.list_value_length(pc.filter(prepared[S.INPUT_IDS], ok))).as_py() or 0
    text_bytes = pc.sum(pc.binary_length(pc.filter(prepared[S.TEXT], ok))).as_py() or 0
    n_ok = pc.sum(ok).as_py() or 0
    return max(1.0, text_bytes / (tokens - 2 * n_ok)) if tokens > 2 * n_ok and text_bytes else 1.0


def _local_flops(device: str) -> float:
    """The rate assumed for scoring in this process: a GPU's where one is asked for or (`auto`) present, else
    the CPU's per torch thread (OMP_NUM_THREADS where set, else the usable CPUs)."""
    if device.startswith("cuda") or (device == "auto" and Path("/dev/nvidiactl").exists()):
        return GPU_FLOPS
    try:
        threads = int(os.environ["OMP_NUM_THREADS"])
    except (KeyError, ValueError):
        threads = usable_cpus()
    return CPU_FLOPS_PER_THREAD * max(1, threads)


def _log_cost(spec: InputSpec, plan: list[Shard]) -> None:
    if spec.cost is None or not plan:
        return
    rows = sum(s.rows for s in plan)
    logger.info(
        "%d rows in %d shards of up to %d rows, each about %.0f s of scoring or less by its estimated work (a stop "
        "loses at most the shards in flight; --shard-rows N sets rows a shard instead)",
        rows,
        len(plan),
        max(s.rows for s in plan),
        SHARD_SECONDS,
    )


def _with(config: RunConfig, **changes: object) -> RunConfig:
    return dataclasses.replace(config, inputs=dataclasses.replace(config.inputs, **changes))


def _recorded(output: str, workload: str, spec: InputSpec) -> tuple[int, ShardCost | None] | None:
    """The shard size and cost of the run that a folder holds, when it is this workload's on these inputs: a
    rerun resumes its shards. None for a new folder, another run's, or one that cannot be read now (`claim`
    then says why, in one line)."""
    try:
        out = OutputDir(output)
        # one request first, sent once: a store that cannot be reached is the claim's to tell, in one line
        run = out.read_json(RUN_FILE) if out.exists(out.path(RUN_FILE)) else None
    except (OSError, ValueError, UserError):
        return None
    if not run or run.get("workload") != workload or run.get("inputs") != list(spec.paths):
        return None
    rows = run.get("shard_rows")
    if not isinstance(rows, int) or rows < 1:
        return None
    try:
        return rows, ShardCost.from_json(run["shard_cost"]) if run.get("shard_cost") else None
    except (TypeError, ValueError, KeyError):
        return None
