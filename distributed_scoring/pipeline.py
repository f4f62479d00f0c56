"""The Ray Data execution of a run: the only place that calls `map_batches`.

read (tasks) -> prepare (CPU actors, tokenizer) -> score (actors, one model replica each; one GPU each
on GPU clusters) -> write (tasks); the driver then aggregates over the written files (`runner.py`).

Rows of this dataset are work items, not sentences: first a read unit, then one shard per row, with
the shard's table carried as Arrow IPC bytes. A shard thus moves through the stages as one indivisible
row whatever Ray Data does with blocks, so its file is written whole and marked done exactly once; the
shard of a killed actor is scored again by its replacement (Ray Data restarts pool actors and retries
their tasks). The stages are the workload's own (`workloads.py`), as in the in-process execution.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from .config import InputSpec, RayOptions, RunConfig
from .errors import UserError
from .models import quiet_transformers
from .output import OutputDir
from .progress import Progress
from .sources import Shard, read_unit, read_units
from .workloads import Workload

logger = logging.getLogger(__name__)

UNIT, SHARD, TABLE, SIGNATURE = "unit", "shard", "table", "signature"
LOCAL_SPARE_CPUS = 2  # logical CPUs an embedded Ray declares beyond the cores, for read/prepare/write
IO_CPUS = 0.25  # read and write tasks wait on storage more than they compute
# Errors a map task is retried on (up to MAX_RETRIES times), matched against the message: Ray Data's
# own transient storage errors and common network failures.
TRANSIENT_ERRORS = ("Connection reset", "Connection refused", "timed out", "Temporary failure", "503")
MAX_RETRIES = 3


class StallError(RuntimeError):
    """No shard finished within the no-progress timeout."""


@dataclass(frozen=True)
class StageResources:
    """The `map_batches` sizing, computed once from the cluster (see `plan_resources`)."""

    actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads_per_actor: int
    prepare_actors: tuple[int, int]


def plan_resources(cluster: dict, options: RayOptions, device: str) -> StageResources:
    """Size the scoring actors so that read, prepare and write always keep CPUs to run on.

    GPU clusters: one actor per GPU (1 GPU, 1 CPU each). CPU clusters: actors of `cpus_per_actor`
    CPUs (default 4, fewer on a small machine), as many as fit beside 2 CPUs for the other stages;
    an embedded Ray declares 2 CPUs beyond the machine's cores for them. Ray Data hangs silently when
    scoring actors take every CPU, so such a request is refused here.
    """
    cpus = float(cluster.get("CPU", 0))
    gpus = float(cluster.get("GPU", 0))
    use_gpus = device in ("auto", "cuda") and gpus >= 1
    if device.startswith("cuda") and gpus < 1:
        raise UserError("--device cuda was asked for, but the Ray cluster has no GPUs")
    if use_gpus:
        cpus_per_actor = options.cpus_per_actor or 1.0
        actors = options.num_actors or int(gpus)
        if actors > gpus:
            raise UserError(f"{actors} scoring actors need {actors} GPUs; the cluster has {gpus:g}")
    else:
        cpus_per_actor = options.cpus_per_actor or min(4.0, max(1.0, cpus - LOCAL_SPARE_CPUS))
        actors = options.num_actors or max(1, int((cpus - LOCAL_SPARE_CPUS) // cpus_per_actor))
    spare = cpus - actors * cpus_per_actor
    if spare < 1 + 2 * IO_CPUS:
        raise UserError(
            f"{actors} scoring actors x {cpus_per_actor:g} CPUs leave {spare:g} of the cluster's {cpus:g} CPUs "
            f"for reading, tokenising and writing; at least {1 + 2 * IO_CPUS:g} are needed or Ray Data stalls. "
            "Lower --num-actors or --cpus-per-actor."
        )
    return StageResources(
        actors=actors,
        cpus_per_actor=cpus_per_actor,
        gpus_per_actor=1.0 if use_gpus else 0.0,
        threads_per_actor=max(1, int(cpus_per_actor)),
        prepare_actors=(1, max(1, min(actors, int(spare - 2 * IO_CPUS)))),
    )


# Payload rows: a shard and its table.


def pack(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def unpack(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def payload(shard: str, table: pa.Table, **extra: str) -> pa.Table:
    return pa.table({SHARD: [shard], TABLE: pa.array([pack(table)], pa.binary()), **{k: [v] for k, v in extra.items()}})


def _each(batch: pa.Table) -> Iterator[dict]:
    return iter(batch.to_pylist())


# Stages.


def read_stage(batch: pa.Table, spec: InputSpec) -> Iterator[pa.Table]:
    """A read unit in, one payload row per shard out."""
    for row in _each(batch):
        unit = [Shard.from_json(s) for s in json.loads(row[UNIT])]
        for shard, rows in read_unit(unit, spec):
            yield payload(shard.to_json(), rows)


class PrepareStage:
    """Tokenises on CPU; holds the workload's preparer (a tokenizer, never the model)."""

    def __init__(self, workload: Workload) -> None:
        quiet_transformers()
        self.preparer = workload.make_preparer()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([payload(r[SHARD], self.preparer(unpack(r[TABLE]))) for r in _each(batch)])


class ScoreStage:
    """One model replica per actor; `threads` sizes torch's CPU thread pool to the actor's CPUs."""

    def __init__(self, workload: Workload, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        quiet_transformers()
        self.scorer = workload.make_scorer()
        self.signature = json.dumps(self.scorer.signature)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables(
            [payload(r[SHARD], self.scorer(unpack(r[TABLE])), signature=self.signature) for r in _each(batch)]
        )


def write_stage(batch: pa.Table, output: str) -> pa.Table:
    """Writes each shard's file and marker; returns what the driver counts progress with."""
    out = OutputDir(output)
    keys, rows = [], []
    for r in _each(batch):
        shard = Shard.from_json(r[SHARD])
        out.write_shard(shard.key, unpack(r[TABLE]), json.loads(r[SIGNATURE]))
        keys.append(shard.key)
        rows.append(shard.rows)
    return pa.table({"key": keys, "rows": rows})


def build_dataset(workload: Workload, spec: InputSpec, units: list[list[Shard]], resources: StageResources,
                  output: str):
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = os.isatty(2)
    context.retried_map_errors = [*context.retried_io_errors, *TRANSIENT_ERRORS]
    context.max_map_retries = MAX_RETRIES
    items = [{UNIT: json.dumps([s.to_json() for s in unit])} for unit in units]
    common = dict(batch_size=1, batch_format="pyarrow")
    prepare_min, prepare_max = resources.prepare_actors
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(read_stage, fn_kwargs={"spec": spec}, num_cpus=IO_CPUS, **common)
    ds = ds.map_batches(
        PrepareStage, fn_constructor_kwargs={"workload": workload}, num_cpus=1,
        compute=ray.data.ActorPoolStrategy(min_size=prepare_min, max_size=prepare_max), **common,
    )
    ds = ds.map_batches(
        ScoreStage,
        fn_constructor_kwargs={"workload": workload, "threads": resources.threads_per_actor},
        num_cpus=resources.cpus_per_actor, num_gpus=resources.gpus_per_actor,
        compute=ray.data.ActorPoolStrategy(size=resources.actors), **common,
    )
    return ds.map_batches(write_stage, fn_kwargs={"output": output}, num_cpus=IO_CPUS, **common)


# Driver.


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[None]:
    """Use the Ray this process already has, join `address`/`RAY_ADDRESS`, or start an embedded one
    (shut down again on exit)."""
    import ray

    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = options.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=(os.cpu_count() or 1) + LOCAL_SPARE_CPUS, include_dashboard=False)
    try:
        yield
    finally:
        if not address:
            ray.shutdown()


def consume(items: Iterable[dict], on_item: Callable[[dict], None], stall_timeout_s: float) -> None:
    """Drain `items`, raising `StallError` when none arrives within `stall_timeout_s`."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        try:
            for item in items:
                q.put(("item", item))
            q.put(("done", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the driver thread
            q.put(("error", exc))

    threading.Thread(target=pump, daemon=True, name="dscore-consume").start()
    while True:
        try:
            kind, value = q.get(timeout=stall_timeout_s)
        except queue.Empty:
            raise StallError(
                f"no shard finished in {stall_timeout_s:.0f} s; the cluster may lack free CPUs for reading "
                "and writing, or a scoring actor may be stuck. Finished shards are kept: rerun to resume."
            ) from None
        if kind == "done":
            return
        if kind == "error":
            raise value
        on_item(value)


def execute_ray(workload: Workload, config: RunConfig, todo: list[Shard], out: OutputDir, options: RayOptions) -> None:
    """Run the unfinished shards through the pipeline on an embedded or joined Ray."""
    import ray

    with ray_session(options):
        resources = plan_resources(ray.cluster_resources(), options, workload.device)
        logger.info("running %d shards of %s on Ray: %s", len(todo), workload.name, resources)
        dataset = build_dataset(workload, config.inputs, read_units(todo), resources, out.location)
        progress = Progress(sum(s.rows for s in todo), bar=False)
        consume(dataset.iter_rows(), lambda row: progress.update(row["rows"]), options.stall_timeout_s)
