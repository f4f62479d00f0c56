"""What every trainer takes: the model to start from, the training folder, the schedule and the Ray
Train resources."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..common import add_address, add_revision

if TYPE_CHECKING:
    from ...workflows.train.run import TrainOptions, TrainResources


def add_train_arguments(p: argparse.ArgumentParser, lr: float) -> None:
    """What every training command takes: the model, the folder, the schedule and where it runs; `lr` is
    the command's default learning rate."""
    from ...workflows.train.run import TrainOptions, TrainResources

    p.add_argument("--model", required=True, help="the masked LM to start from (local folder or Hub id)")
    p.add_argument(
        "--output",
        required=True,
        help="training folder (local or shared path): checkpoints, metrics.jsonl, report.json, the model",
    )
    _add_schedule_arguments(p, TrainOptions(), lr)
    p.add_argument("--batch-tokens", type=int, default=None, help="token budget of the evaluation's forward passes")
    add_revision(p)
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run code shipped with the model")
    p.add_argument(
        "--overwrite", action="store_true", help="start again in a folder that holds a different training run"
    )
    _add_resource_arguments(p, TrainResources())


def _add_schedule_arguments(p: argparse.ArgumentParser, d: TrainOptions, lr: float) -> None:
    """The schedule, `TrainOptions`' fields: how long, how fast, on which rows; `d` gives the defaults."""
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training split (default {d.epochs})")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps instead of --epochs")
    p.add_argument(
        "--lr",
        type=float,
        default=lr,
        help=f"peak AdamW learning rate, warmed up and decayed linearly (default {lr:g})",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help=f"sequences per step over all workers (default {d.batch_size})",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the split, the batches and the masks")
    p.add_argument(
        "--max-length",
        type=int,
        default=d.max_length,
        help=f"training sequences longer than this (tokens, specials included) are left out (default {d.max_length})",
    )
    p.add_argument(
        "--heldout",
        type=float,
        default=d.heldout,
        help=f"share of the rows kept out of training for the report (default {d.heldout})",
    )


def _add_resource_arguments(p: argparse.ArgumentParser, r: TrainResources) -> None:
    """The "Ray Train" group, `TrainResources`' fields: where the workers run; `r` gives the defaults."""
    ray = p.add_argument_group(
        "Ray Train", "training runs on Ray Train: an embedded local Ray unless a cluster is given"
    )
    ray.add_argument(
        "--ray", action="store_true", help="accepted as in the scoring commands: training always runs on Ray"
    )
    ray.add_argument("--num-workers", type=int, default=r.num_workers, help="data-parallel workers (default 1)")
    ray.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    ray.add_argument(
        "--cpus-per-worker",
        type=float,
        default=r.cpus_per_worker,
        help=f"CPUs of each worker (default {r.cpus_per_worker:g})",
    )
    ray.add_argument(
        "--checkpoint-every",
        type=int,
        default=r.checkpoint_every,
        help=f"steps between checkpoints (default {r.checkpoint_every}); a rerun continues from the latest",
    )
    add_address(ray)


def train_options(args: argparse.Namespace) -> tuple[TrainOptions, TrainResources]:
    """The schedule and the Ray Train resources of `add_train_arguments`' flags."""
    from ...workflows.train.run import TrainOptions, TrainResources

    options = TrainOptions(args.epochs, args.steps, args.lr, args.batch_size, args.seed, args.max_length, args.heldout)
    resources = TrainResources(
        args.num_workers, args.use_gpu, args.cpus_per_worker, args.checkpoint_every, args.address
    )
    return options, resources
