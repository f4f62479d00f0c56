"""The Ray Data execution of a run: the only place that calls `map_batches`.

read (tasks) -> prepare (CPU actors, tokenizer) -> score (actors, one model replica each; one GPU each
on GPU clusters) -> write (tasks); the driver then aggregates over the written files (`runner.py`).

Rows of this dataset are work items, not sentences: first a read unit, then one shard per row, with
the shard's table carried as Arrow IPC bytes. A shard thus moves through the stages as one indivisible
row whatever Ray Data does with blocks, so its file is written whole and marked done exactly once; the
shard of a killed actor is scored again by its replacement (Ray Data restarts pool actors and retries
their tasks). The stages are the workload's own (`workloads/`), as in the in-process execution; how
many actors of each and with what CPUs and GPUs is planned in `resources.py`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import queue
import re
import sys
import threading
import time
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from .. import stopping
from ..config import STORAGE_RETRY_ENV, UNSAFE_LOCK_ENV, InputSpec, RayOptions, RunConfig
from ..cpus import set_torch_threads, thread_env
from ..errors import DataLossError, UserError
from ..io.output import OutputDir
from ..io.provenance import rows_digest
from ..io.sources import Shard, read_unit, read_units
from ..io.storage import error_reason
from ..quiet import quiet_transformers
from .cluster import cluster_address, ray_session
from .progress import Pace, Progress, ignore, rows_done
from .resources import IO_CPUS, StageResources, plan_when_ready
from .workload import Workload

logger = logging.getLogger(__name__)

UNIT, SHARD, TABLE, SIGNATURE, DIGEST = "unit", "shard", "table", "signature", "digest"
# Errors a map task is retried on (up to MAX_RETRIES times), matched against the message: Ray Data's
# own transient storage errors and common network failures.
TRANSIENT_ERRORS = ("Connection reset", "Connection refused", "timed out", "Temporary failure", "503")
MAX_RETRIES = 3
# What a run on Ray waits for before its first forward pass, in its progress line.
ACTORS_WAITING = "waiting for the scoring actors to start and load the model"
REPORT_EVERY_S = 1.0  # the most often a scoring actor posts how far its shard has got
POLL_S = 1.0  # how often the driver collects those posts
STOP_WAIT_S = 30.0  # the most a run that stops early waits for Ray Data's execution to end
FEWER_THREADS = "give the scoring actors fewer CPUs each (--cpus-per-actor 1: one torch thread each)"  # see Pace


class StallError(DataLossError):
    """No shard finished within the no-progress timeout (finished shards are kept: a rerun resumes)."""


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
    """An item of read units (`_items`) in, one payload row per shard out."""
    for row in _each(batch):
        for unit in json.loads(row[UNIT]):
            for shard, rows in read_unit([Shard.from_json(s) for s in unit], spec):
                yield payload(shard.to_json(), rows, digest=rows_digest(rows))


def _items(units: list[list[Shard]], rows: int, work: float | None = None) -> list[dict]:
    """The dataset's items: consecutive read units grouped up to about `rows` rows and, for shards cut by
    work, `work` estimated FLOPs (a unit never split).

    Ray Data runs a task per item and a block per task through every stage, tens of milliseconds each: with
    one item per shard, 10^4 small files (10 rows each) cost minutes of that alone. Shards of `shard_rows`
    rows keep an item each; small files' shards travel together, and each is still scored and written,
    with its marker, as a shard of its own. Shards cut by work keep an item each as well: an item's shards
    are written when it is done, so a stop loses its whole item.
    """
    groups: list[list[list[Shard]]] = []
    held, held_work = rows, 0.0  # rows and work in the last group: start a new group first
    for unit in units:
        size = sum(shard.rows for shard in unit)
        size_work = sum(shard.work or 0.0 for shard in unit)
        if held + size > rows or (work is not None and held_work + size_work > work):
            groups.append([])
            held, held_work = 0, 0.0
        groups[-1].append(unit)
        held += size
        held_work += size_work
    return [{UNIT: json.dumps([[s.to_json() for s in unit] for unit in group])} for group in groups]


class PrepareStage:
    """Tokenises on CPU; holds the workload's preparer (a tokenizer, never the model)."""

    def __init__(self, workload: Workload) -> None:
        quiet_transformers()
        self.preparer = workload.make_preparer()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables(
            [payload(r[SHARD], self.preparer(unpack(r[TABLE])), digest=r[DIGEST]) for r in _each(batch)]
        )


class ScoreStage:
    """One model replica per actor; `threads` sizes torch's CPU thread pool to the actor's CPUs, never
    beyond the CPUs this actor really has (`cpus.usable_cpus`: Ray's CPUs may be over-declared, and more
    threads than CPUs fight). How far each shard has got goes to the run's `ProgressBoard` as the
    workload's stage reports it, and so does a collapse of its forward passes' pace (`Pace`)."""

    def __init__(self, workload: Workload, threads: int, board=None) -> None:
        threads = set_torch_threads(threads)
        quiet_transformers()
        self.scorer = workload.make_scorer()
        self.signature = json.dumps(self.scorer.signature)
        self.board = board
        self.pace = None if board is None else Pace(board.warn.remote, threads, FEWER_THREADS)

    def __call__(self, batch: pa.Table) -> pa.Table:
        tables = []
        for r in _each(batch):
            shard = Shard.from_json(r[SHARD])
            prepared = unpack(r[TABLE])
            report = ignore if self.board is None else self.pace.watch(BoardReport(self.board, shard.key, shard.rows))
            scored = self.scorer(prepared, report)
            tables.append(payload(r[SHARD], scored, signature=self.signature, digest=r[DIGEST]))
        return pa.concat_tables(tables)


class ProgressBoard:
    """A small actor (no CPU) where scoring actors post how many rows of their shards are done, and any
    warning of theirs, for the driver to collect: Ray Data hands the driver a shard only once it is written."""

    def __init__(self) -> None:
        self.rows: dict[str, float] = {}
        self.warnings: list[str] = []

    def post(self, key: str, rows: float) -> None:
        self.rows[key] = rows

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def collect(self) -> tuple[dict[str, float], list[str]]:
        """The rows done of every shard posted since the last collection, and the warnings posted since."""
        rows, warnings, self.rows, self.warnings = self.rows, self.warnings, {}, []
        return rows, warnings


class BoardReport:
    """A scoring actor's `Report` for one shard: its rows done, posted at most every REPORT_EVERY_S
    (without waiting for the board)."""

    def __init__(self, board, key: str, rows: int) -> None:
        self.board, self.key, self.rows = board, key, rows
        self.posted = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.posted >= REPORT_EVERY_S:
            self.posted = now
            self.board.post.remote(self.key, rows_done(self.rows, done, total))


def write_stage(batch: pa.Table, output: str) -> pa.Table:
    """Writes each shard's file and marker; returns what the driver counts progress with."""
    out = OutputDir(output)
    keys, rows = [], []
    for r in _each(batch):
        shard = Shard.from_json(r[SHARD])
        out.write_shard(shard.key, unpack(r[TABLE]), json.loads(r[SIGNATURE]), r[DIGEST])
        keys.append(shard.key)
        rows.append(shard.rows)
    return pa.table({"key": keys, "rows": rows})


def build_dataset(
    workload: Workload,
    spec: InputSpec,
    units: list[list[Shard]],
    resources: StageResources,
    output: str,
    board=None,
    ray_bars: bool = False,
):
    """The pipeline's dataset; `board` collects the scoring actors' progress, `ray_bars` shows Ray Data's
    own progress bars (the run has its own display)."""
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = ray_bars
    context.retried_map_errors = [*context.retried_io_errors, *TRANSIENT_ERRORS]
    context.max_map_retries = MAX_RETRIES
    context.raise_original_map_exception = True  # a stage's error reaches the driver as itself (see `plain_error`)
    rows = sum(shard.rows for unit in units for shard in unit)
    budget = spec.cost.flops_per_shard if spec.cost is not None else None
    items = _items(units, min(spec.shard_rows, max(1, math.ceil(rows / resources.actors))), budget)  # every actor works
    common = dict(batch_size=1, batch_format="pyarrow")
    prepare_min, prepare_max = resources.prepare_actors
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(read_stage, fn_kwargs={"spec": spec}, num_cpus=IO_CPUS, **common)
    ds = ds.map_batches(
        PrepareStage,
        fn_constructor_kwargs={"workload": workload},
        num_cpus=1,
        compute=ray.data.ActorPoolStrategy(min_size=prepare_min, max_size=prepare_max),
        **common,
    )
    env = thread_env()  # before torch starts in the actor; nodes of a joined cluster lack the driver's
    ds = ds.map_batches(
        ScoreStage,
        fn_constructor_kwargs={"workload": workload, "threads": resources.threads_per_actor, "board": board},
        num_cpus=resources.cpus_per_actor,
        num_gpus=resources.gpus_per_actor,
        compute=ray.data.ActorPoolStrategy(size=resources.actors),
        **common,
        **({"runtime_env": {"env_vars": env}} if env else {}),
    )
    storage = {name: os.environ[name] for name in (STORAGE_RETRY_ENV, UNSAFE_LOCK_ENV) if name in os.environ}
    return ds.map_batches(
        write_stage,
        fn_kwargs={"output": output},
        num_cpus=IO_CPUS,
        **common,
        **({"runtime_env": {"env_vars": storage}} if storage else {}),  # the storage flags, on every node
    )


# Driver.


def consume(
    items: Iterable[dict],
    on_item: Callable[[dict], None],
    stall_timeout_s: float,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = POLL_S,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Drain `items` in a thread of its own, calling `on_tick` every `tick_s` seconds meanwhile; raises
    `StallError` when no item arrives within `stall_timeout_s`. Should this thread stop early (an error, a
    signal's `Stopped`), `stop()` ends what produces the items and, when it says so, the draining thread is
    waited for (`STOP_WAIT_S` at most), so that nothing iterates a Ray that is being shut down."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        try:
            for item in items:
                q.put(("item", item))
            q.put(("done", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the driver thread
            q.put(("error", exc))

    thread = threading.Thread(target=pump, daemon=True, name="dscore-consume")
    thread.start()
    try:
        _drain(q, on_item, stall_timeout_s, on_tick, tick_s)
    except BaseException:
        if stop is not None and thread.is_alive():
            ended = False
            with contextlib.suppress(Exception):
                ended = stop()
            if ended:
                thread.join(STOP_WAIT_S)
        raise


def _drain(
    q: queue.Queue,
    on_item: Callable[[dict], None],
    stall_timeout_s: float,
    on_tick: Callable[[], None] | None,
    tick_s: float,
) -> None:
    last_item = last_tick = time.monotonic()
    while True:
        now = time.monotonic()
        if on_tick is not None and now - last_tick >= tick_s:
            on_tick()
            last_tick = now
        wait = stall_timeout_s - (now - last_item)
        if wait <= 0:
            raise StallError(
                f"no shard finished in {stall_timeout_s:.0f} s; the cluster may lack free CPUs for reading "
                "and writing, or a scoring actor may be stuck. Finished shards are kept: rerun to resume."
            )
        try:
            kind, value = q.get(timeout=min(wait, tick_s) if on_tick is not None else wait)
        except queue.Empty:
            continue
        if kind == "done":
            return
        if kind == "error":
            raise value
        last_item = time.monotonic()
        on_item(value)


def execute_ray(
    workload: Workload,
    config: RunConfig,
    todo: list[Shard],
    out: OutputDir,
    options: RayOptions,
    progress: bool | None = None,
) -> None:
    """Run the unfinished shards through the pipeline on an embedded or joined Ray, with one progress
    display fed by the scoring actors while they score and by the written shards."""
    import ray

    bar = sys.stderr.isatty() if progress is None else progress  # before Ray's output is piped off fd 2
    # A pipeline that failed earlier in this process (a rerun from Python, a notebook, a test session) keeps
    # its actors, and their CPUs, until the garbage collector frees the reference cycles of its error's
    # traceback; this pipeline's actors would wait for those CPUs. Free them first.
    gc.collect()
    with ray_session(options):
        joined = cluster_address(options.address) is not None
        resources = plan_when_ready(options, workload.device, joined).at_most(len(todo))
        logger.info("running %d shards of %s on Ray: %s", len(todo), workload.name, resources)
        board = ray.remote(num_cpus=0)(ProgressBoard).remote()
        try:
            dataset = build_dataset(
                workload,
                config.inputs,
                read_units(todo),
                resources,
                out.location,
                board,
                ray_bars=options.verbose and bar,
            )
            display = Progress(sum(s.rows for s in todo), bar=bar, waiting=ACTORS_WAITING)
            try:
                consume(
                    dataset.iter_rows(),
                    lambda row: display.finished(row["key"], row["rows"]),
                    options.stall_timeout_s,
                    on_tick=_collector(board, display),
                    stop=lambda: _shut_down_execution(dataset, joined),
                )
            except Exception as exc:  # noqa: BLE001 - re-raised, as what it means where it is known
                plain = plain_error(exc)
                if plain is exc:
                    raise
                raise plain from exc
            finally:
                display.close()
        finally:
            ray.kill(board)


def _shut_down_execution(dataset, joined: bool) -> bool:
    """End Ray Data's execution of `dataset` from the driver's thread, so that the thread iterating it sees
    the end before Ray is shut down: a thread that touches Ray after `ray.shutdown` makes Ray's core worker
    end the whole process (exit 1, no word). Ray Data keeps the executor of an iteration on the dataset.
    Not when a signal stops a driver with an embedded Ray: it exits at once (`cluster.ray_session`), and
    its Ray may already be going (a kill of its whole control group), where this call could hang. Returns
    whether it ended the execution."""
    if stopping.signalled() and not joined:
        return False
    executor = getattr(dataset, "_current_executor", None)
    if executor is not None:
        executor.shutdown(force=True)
    return True


class WorkersLostError(DataLossError):
    """Ray lost the workers running the run (its out-of-memory killer, a node gone); a rerun resumes."""


def plain_error(exc: Exception) -> BaseException:
    """What a failure of the Ray pipeline means to the user, or `exc` itself when it is a bug.

    Ray's out-of-memory killer and the deaths of workers, actors or nodes end the run as incomplete (its
    finished shards are kept). A stage's own error arrives wrapped in a `RayTaskError` whose traceback
    text is the remote one: the error a user can act on (bad input, rows lost, a failed write: an
    `OSError`, which the runner words) is taken out of it, so the CLI prints its one line.
    """
    import ray.exceptions as rex

    if any(isinstance(e, rex.OutOfMemoryError) for e in _causes(exc)):
        return WorkersLostError(
            "Ray's out-of-memory killer stopped a worker of this run (the machine ran low on memory); the shards "
            "finished before it are kept: rerun the same command to resume, once other work has freed memory, or "
            "with fewer --num-actors or a smaller --batch-tokens"
        )
    if isinstance(exc, rex.RayActorError) and getattr(exc, "actor_init_failed", False):
        return ActorStartError(
            f"an actor of this run could not start: {remote_error(str(exc))}; no rerun can change that: fix the "
            "cause first"
        )
    lost = (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError)
    if isinstance(exc, lost):
        return WorkersLostError(
            f"Ray lost a worker of this run ({type(exc).__name__}: {error_reason(exc)}); the shards finished before "
            "it are kept: rerun the same command to resume"
        )
    if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, (UserError, DataLossError, OSError)):
        return exc.cause
    return exc


class ActorStartError(UserError):
    """An actor's constructor failed (its model cannot be used, a limit of the machine): exit 2, not "rerun"."""


# The last line of a remote traceback that names the error: `package.module.SomeError: what went wrong`.
_REMOTE_ERROR = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit)): (.+)$")


def remote_error(text: str) -> str:
    """The error a remote traceback ends with (`ModelLoadError: ...`), or the text's first line."""
    for line in reversed(text.splitlines()):
        found = _REMOTE_ERROR.match(line.strip())
        if found:
            return f"{found.group(1)}: {found.group(2)}"
    return error_reason(Exception(text))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what caused it: Python's chain, and the original error a `RayTaskError` carries."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        carried = getattr(exc, "cause", None)
        exc = carried if isinstance(carried, BaseException) else exc.__cause__ or exc.__context__


def _collector(board, display: Progress) -> Callable[[], None]:
    """What the driver does every POLL_S: take in the board's posts when its last collection is back
    (never waiting on it), ask for the next, and let the display log a line if one is due."""
    import ray

    pending = [board.collect.remote()]

    def collect() -> None:
        if ray.wait(pending, timeout=0)[0]:
            posted, warnings = ray.get(pending.pop())
            for key, rows in posted.items():
                display.partial(key, rows)
            for message in warnings:
                display.warn(message)
            pending.append(board.collect.remote())
        display.tick()

    return collect
