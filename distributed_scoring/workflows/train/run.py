"""What every training command shares: its options, its folder (claimed by `io.claim.claim_training`), the
held-out split, the Ray Train launch, and what each training worker does around the engine's loop (resume,
report, checkpoint, metrics, progress).

A training folder DIR holds:
    _run.json, _lock.json            what the run is (another command is refused) and what it wrote (for
                                     --overwrite), who holds the folder
    data/train.parquet, heldout.parquet   the split, tokenised (seeded by row id, so stable on reruns)
    checkpoints/                     Ray Train's storage: step-<n>/training_state.pt and its snapshot
    metrics.jsonl                    one line per optimiser step (the batch loss, lr, ...)
    config.json, model.safetensors, tokenizer files ...   the trained model (written at the end)
    report.json                      the command's figures (written last)
Rerunning the same command continues from the latest checkpoint (Ray Train V2 restores it from the
snapshot in checkpoints/); a finished run redoes only its evaluation.

The driver never imports torch: `ray.train.torch` does, so the TorchTrainer is built and fitted inside a
Ray task (no CPUs of its own: the trainer's workers hold them), and the training loop runs on the
trainer's workers. Ray keeps its workers' output off the user's terminal (unless --verbose), so the
workers' own log lines (progress, the checkpoint a run continues from, warnings) reach the driver through
a `Relay` actor, and the driver logs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import posixpath
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow.parquet as pq

from ...config import ModelSpec, RayOptions
from ...cpus import set_torch_threads
from ...io import schema as S
from ...io.claim import TRAINING
from ...io.output import REPORT_JSON, OutputDir
from ...options import check, option
from ...pipeline.cluster import cluster_address, ray_session
from ...quiet import quiet_transformers

if TYPE_CHECKING:  # torch code, imported on the training workers only
    from ...engine.training import Example, Objective

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
DATA_TRAIN = "data/train.parquet"
DATA_HELDOUT = "data/heldout.parquet"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_KEPT = 2
PROGRESS_S = 10.0  # seconds between progress lines (and rewrites of metrics.jsonl) on worker 0
RELAY_S = 1.0  # seconds between the driver's collections of the workers' log lines

# Columns of the tokenised split (the prepare stage's and the teacher's names where they exist).
TARGET = "target"
TOKEN_TARGETS = "token_targets"  # maskless: the teacher's log p(w_t | W without w_t) at each scored position


@dataclass(frozen=True)
class TrainOptions:
    """What changes the trained model (all of it enters the run's fingerprint): `steps` optimiser steps of
    `batch_size` examples over all workers, or `epochs` passes over the training split when `steps` is
    None; AdamW at peak `lr`; sequences longer than `max_length` tokens left out of training; a share
    `heldout` of the rows (by a hash of their id and `seed`) kept out for evaluation. Each field declares
    its flag (every trainer's)."""

    epochs: int = option(3, "passes over the training split (default {default})", low=1)
    steps: int | None = option(None, "optimiser steps instead of --epochs", low=1, type=int)
    lr: float = option(  # each trainer sets its own default (`set_defaults`), which argparse's %(default)g shows
        5e-5, "peak AdamW learning rate, warmed up and decayed linearly (default %(default)g)", low=0, above=True
    )
    batch_size: int = option(16, "sequences per step over all workers (default {default})", low=1)
    seed: int = option(0, "seed of the split, the batches and the masks", low=0)  # numpy and torch: no negative seed
    max_length: int = option(
        128,
        "training sequences longer than this (tokens, specials included) are left out (default {default})",
        low=3,
    )
    heldout: float = option(  # a share of the rows
        0.1,
        "share of the rows kept out of training for the report (default {default})",
        low=0,
        high=1,
        above=True,
        below=True,
    )

    def __post_init__(self) -> None:
        check(self)

    def total_steps(self, examples: int) -> int:
        """`steps`, or `epochs` passes of whole batches (the engine leaves the remainder of an epoch out)."""
        return self.steps or self.epochs * (examples // self.batch_size)


@dataclass(frozen=True)
class TrainResources:
    """Where and how a training run executes (none of it changes the result): data-parallel workers of
    `cpus_per_worker` CPUs (and one GPU each with `use_gpu`), a checkpoint every `checkpoint_every`
    steps, on the Ray cluster at `address` (default: $RAY_ADDRESS, else an embedded local Ray). The fields
    but `address` declare their flags (the "Ray Train" group of every trainer)."""

    num_workers: int = option(1, "data-parallel workers (default {default})", low=1)
    use_gpu: bool = option(False, "one GPU per worker")
    cpus_per_worker: float = option(2.0, "CPUs of each worker (default {default:g})", low=0, above=True)
    checkpoint_every: int = option(
        100, "steps between checkpoints (default {default}); a rerun continues from the latest", low=1
    )
    address: str | None = None  # --address, as the scoring commands take it (`cli.common.add_address`)

    def __post_init__(self) -> None:
        check(self)

    @property
    def device(self) -> str:
        return "cuda" if self.use_gpu else "cpu"


# What every training run writes beside its model (`io.claim.claim_training` records them for --overwrite).
TRAINING_OUTPUTS = (DATA_TRAIN, DATA_HELDOUT, CHECKPOINTS, METRICS_FILE, REPORT_JSON)


def training_fingerprint(command: str, model: ModelSpec, options: TrainOptions, data: dict) -> dict:
    """A training run's `_run.json`, what must match for a rerun to continue in the same folder: the
    command, the model, every training option and the data's identity (`data`)."""
    return {"workload": TRAINING + command, "model": model.name, "revision": model.revision, **asdict(options), **data}


def heldout_rows(ids: Sequence[str], seed: int, share: float) -> np.ndarray:
    """(N,) bool: the rows kept out of training, by a hash of (seed, id): the same rows whatever the
    order or number of rows around them."""
    return np.array(
        [int.from_bytes(hashlib.sha256(f"{seed}\0{i}".encode()).digest()[:8], "big") / 2.0**64 < share for i in ids],
        dtype=bool,
    )


def read_examples(path: str) -> list[Example]:
    """The engine's training examples from a tokenised split (input_ids, targets, and whichever of the
    maskless targets it has: `target`, `token_targets`, the teacher's conditionals)."""
    from ...engine.training import Example

    table = pq.read_table(path)
    names = table.column_names
    n = table.num_rows

    def column(name: str, dtype: type) -> list:
        if name not in names:
            return [None] * n
        return [np.asarray(v, dtype=dtype) for v in table[name].to_pylist()]

    targets = table[TARGET].to_pylist() if TARGET in names else [0.0] * n
    return [
        Example(np.asarray(ids, dtype=np.int64), np.asarray(positions, dtype=np.int64), float(target), *extra)
        for ids, positions, target, *extra in zip(
            table[S.INPUT_IDS].to_pylist(),
            table[S.TARGETS].to_pylist(),
            targets,
            column(TOKEN_TARGETS, np.float64),
            column(S.COND_IDS, np.int64),
            column(S.COND_LOGPROBS, np.float64),
            column(S.COND_REST, np.float64),
        )
    ]


# Driver: the Ray Train launch and Ray tasks.


@contextlib.contextmanager
def on_ray(resources: TrainResources) -> Iterator[None]:
    """The Ray that training and evaluation run on: joined or embedded, as for scoring (`ray_session`)."""
    with ray_session(RayOptions(resources.address)):
        yield


class Relay:
    """A small actor (no CPU) where training workers post their log lines for the driver to collect and
    log: the one way they reach the user's terminal when Ray keeps its workers' output off it."""

    def __init__(self) -> None:
        self.records: list[tuple[int, str]] = []

    def post(self, level: int, message: str) -> None:
        self.records.append((level, message))

    def collect(self) -> list[tuple[int, str]]:
        """The (level, message) of every line posted since the last collection, in order."""
        records, self.records = self.records, []
        return records


class RelayHandler(logging.Handler):
    """A worker's logging handler that posts each record to the driver's `Relay` (without waiting)."""

    def __init__(self, relay: Any) -> None:
        super().__init__()
        self.relay = relay

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.relay.post.remote(record.levelno, record.getMessage())
        except Exception:  # noqa: BLE001 - a line lost is not worth a training run
            self.handleError(record)


def fit_on_ray(loop: Callable[[dict], None], job: Any, resources: TrainResources, out: OutputDir) -> None:
    """Run `loop(config)` on the trainer's workers (`config["job"]` is `job`) until it returns, checkpoints in
    DIR/checkpoints (continued from there when a snapshot is found), logging the workers' lines here as
    they come. Inside `on_ray`."""
    import ray

    logger.info(
        "starting Ray Train's workers (%d x %g CPUs%s): each imports torch and loads the model before the first "
        "step, which can take a minute",
        resources.num_workers,
        resources.cpus_per_worker,
        " and a GPU" if resources.use_gpu else "",
    )
    began = time.monotonic()
    relay = ray.remote(num_cpus=0)(Relay).remote()
    task = ray.remote(num_cpus=0, max_retries=0)(_fit)
    done = task.remote(loop, job, resources, out.location, cluster_address(resources.address) is None, relay)
    while True:
        finished, _ = ray.wait([done], timeout=RELAY_S)
        for level, message in ray.get(relay.collect.remote()):
            logger.log(level, "%s", message)
        if finished:
            break
    ray.get(done)
    logger.info("Ray Train has shut its workers down (%.0f s after starting them)", time.monotonic() - began)


def _fit(
    loop: Callable[[dict], None], job: Any, resources: TrainResources, storage: str, embedded: bool, relay: Any
) -> None:
    """Build and fit the TorchTrainer (runs as a Ray task: this imports torch)."""
    from ray.train import CheckpointConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    class EmbeddedTrainer(TorchTrainer):
        """Without the placement-group cleaner (Ray 2.60). It polls Ray's state API every second and logs a
        warning each time it cannot reach it, which on an embedded Ray started with the dashboard off (as
        `ray_session` starts one) is every time; an embedded Ray's placement groups end with the driver
        anyway. `_create_default_callbacks` is Ray's private hook: on a Ray without it, nothing is left out."""

        def _create_default_callbacks(self):
            return [
                c for c in super()._create_default_callbacks() if type(c).__name__ != "PlacementGroupCleanerCallback"
            ]

    trainer = (EmbeddedTrainer if embedded else TorchTrainer)(
        loop,
        train_loop_config={"job": job, "resources": resources, "relay": relay},
        scaling_config=ScalingConfig(
            num_workers=resources.num_workers,
            use_gpu=resources.use_gpu,
            resources_per_worker={"CPU": resources.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=CHECKPOINTS,
            storage_path=storage,
            checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
    trainer.fit()


def run_task(fn: Callable[..., Any], resources: TrainResources, *args: Any) -> Any:
    """`fn(*args)` as a Ray task with one worker's resources (evaluation: torch stays off the driver)."""
    import ray

    task = ray.remote(num_cpus=resources.cpus_per_worker, num_gpus=1 if resources.use_gpu else 0, max_retries=0)(fn)
    return ray.get(task.remote(*args))


# On a training worker (or an evaluation task).


@dataclass(frozen=True)
class Worker:
    """This training worker: its rank among `world`, its torch device, the training folder."""

    rank: int
    world: int
    device: str
    out: OutputDir


def start_worker(config: dict) -> Worker:
    """Set up a training worker: threads as its CPUs allow, quiet libraries, its rank and device."""
    import ray.train
    import ray.train.torch

    set_threads(config["resources"].cpus_per_worker, config["relay"])
    context = ray.train.get_context()
    return Worker(
        context.get_world_rank(),
        context.get_world_size(),
        str(ray.train.torch.get_device()),
        OutputDir(config["job"].location),
    )


def set_threads(cpus: float, relay: Any = None) -> None:
    """torch's CPU threads to the worker's CPUs, never beyond the CPUs it really has; transformers quiet; our
    INFO lines (the progress) shown, Ray Train's per-report INFO lines not. With a `relay`, our lines go
    to the driver through it instead of to this worker's output."""
    set_torch_threads(max(1, int(cpus)))
    quiet_transformers()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.WARNING)
    ours = logging.getLogger("distributed_scoring")
    ours.setLevel(logging.INFO)
    for handler in [h for h in ours.handlers if isinstance(h, RelayHandler)]:  # a previous run's, in a reused process
        ours.removeHandler(handler)
    if relay is not None:
        ours.addHandler(RelayHandler(relay))
    ours.propagate = relay is None


def train(objective: Objective, examples: list[Example], job: Any, worker: Worker, what: str) -> None:
    """The engine's loop on this worker: continued from Ray Train's latest checkpoint if there is one, a
    checkpoint every `checkpoint_every` steps (written by worker 0, reported with that step's metrics),
    every step's metrics in metrics.jsonl and a progress line from worker 0.

    Only checkpoint steps go through `ray.train.report`: a report waits until the controller has taken
    the previous one, which it polls for every 2 s (Ray 2.60), so a report per step would hold training
    to one step per poll.
    """
    import ray.train
    from ray.train.torch import prepare_model

    from ...engine.training import Schedule, fit

    schedule = Schedule(job.steps, job.options.batch_size, job.options.lr, job.options.seed, job.checkpoint_every)
    log = MetricsLog(worker.out, job.steps, what) if worker.rank == 0 else None
    if worker.rank == 0:
        logger.info("%s: %d worker(s) up, model loaded; training %d steps", what, worker.world, job.steps)
    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as resume:
        if resume:
            logger.info("%s: continuing from checkpoint %s", what, posixpath.basename(checkpoint.path))
        fit(objective, examples, schedule, _reporter(worker, log), resume, prepare_model, worker.rank, worker.world)
    if log is not None:
        log.close()


def _reporter(worker: Worker, log: MetricsLog | None) -> Callable[[int, dict, Callable[[str], None] | None], None]:
    """The engine's `on_step`: every step into metrics.jsonl (worker 0); at checkpoint steps the state as a
    Ray Train checkpoint, written by worker 0 and reported by every worker (a report is a barrier)."""
    import tempfile

    import ray.train

    def on_step(step: int, metrics: dict, save: Callable[[str], None] | None) -> None:
        if log is not None:
            log.add(metrics, checkpoint=save is not None)
        if save is None:
            return
        with tempfile.TemporaryDirectory() as folder:
            if worker.rank == 0:
                save(folder)
                ray.train.report(
                    metrics,
                    checkpoint=ray.train.Checkpoint.from_directory(folder),
                    checkpoint_dir_name=f"step-{step:08d}",
                )
            else:
                ray.train.report(metrics)

    return on_step


class MetricsLog:
    """metrics.jsonl (one line per step) and the progress line, on worker 0. The file is rewritten whole
    every PROGRESS_S seconds and at checkpoints, so it is never half a line; lines of steps after the
    checkpoint a run continues from are dropped first (that run redoes those steps)."""

    def __init__(self, out: OutputDir, total: int, what: str) -> None:
        self.out = out
        self.total = total
        self.what = what
        self.lines: list[str] | None = None
        self.started = self.last = time.monotonic()
        self.first_step = 0

    def add(self, metrics: dict, checkpoint: bool) -> None:
        if self.lines is None:
            self.first_step = metrics["step"] - 1
            self.lines = [
                line for line in _read_lines(self.out, METRICS_FILE) if json.loads(line)["step"] <= self.first_step
            ]
        self.lines.append(json.dumps(metrics))
        now = time.monotonic()
        if checkpoint or now - self.last >= PROGRESS_S or metrics["step"] == self.total:
            self.last = now
            self.flush()
            done = metrics["step"] - self.first_step
            rate = done / max(now - self.started, 1e-9)
            logger.info(
                "%s step %d/%d: loss %.4f, lr %.2e, %.2f steps/s, %s left",
                self.what,
                metrics["step"],
                self.total,
                metrics["loss"],
                metrics["lr"],
                rate,
                _duration((self.total - metrics["step"]) / rate),
            )
        if metrics["step"] == self.total:
            logger.info(
                "%s: last step done; writing its checkpoint and the model, then Ray Train shuts its workers down",
                self.what,
            )

    def flush(self) -> None:
        self.out.write_text(METRICS_FILE, "".join(line + "\n" for line in self.lines or []))

    def close(self) -> None:
        if self.lines is not None:
            self.flush()


def _read_lines(out: OutputDir, name: str) -> list[str]:
    if not out.exists(out.path(name)):
        return []
    with out.fs.open_input_stream(out.path(name)) as stream:
        return stream.read().decode("utf-8").splitlines()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def training_figures(out: OutputDir, steps: int, options: TrainOptions, loss: str) -> dict:
    """The report's training figures: the schedule, and the loss (`loss` says which) at the start and at
    the end, each the mean over up to 10 steps of metrics.jsonl."""
    losses = [json.loads(line)["loss"] for line in _read_lines(out, METRICS_FILE)]
    window = max(1, min(10, len(losses) // 2))
    return {
        "steps": steps,
        "epochs": options.epochs if options.steps is None else None,
        "batch_size": options.batch_size,
        "lr": options.lr,
        "seed": options.seed,
        "loss": loss,
        "loss_first": float(np.mean(losses[:window])) if losses else None,
        "loss_last": float(np.mean(losses[-window:])) if losses else None,
    }
