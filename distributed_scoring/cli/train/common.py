"""What every trainer takes: the model to start from, the training folder, the schedule and the Ray
Train resources."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..common import add_address, add_options, add_revision, options_from

if TYPE_CHECKING:
    from ...workflows.train.run import TrainOptions, TrainResources


def add_train_arguments(p: argparse.ArgumentParser, lr: float) -> None:
    """What every training command takes: the model, the folder, the schedule (`TrainOptions`) and where it
    runs (`TrainResources`); `lr` is the command's default learning rate."""
    from ...workflows.train.run import TrainOptions, TrainResources

    p.add_argument("--model", required=True, help="the masked LM to start from (local folder or Hub id)")
    p.add_argument(
        "--output",
        required=True,
        help="training folder (local or shared path): checkpoints, metrics.jsonl, report.json, the model",
    )
    add_options(p, TrainOptions)
    p.set_defaults(lr=lr)  # the trainer's own, which --lr's help shows
    p.add_argument("--batch-tokens", type=int, default=None, help="token budget of the evaluation's forward passes")
    add_revision(p)
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run code shipped with the model")
    p.add_argument(
        "--overwrite", action="store_true", help="start again in a folder that holds a different training run"
    )
    ray = p.add_argument_group(
        "Ray Train", "training runs on Ray Train: an embedded local Ray unless a cluster is given"
    )
    ray.add_argument(
        "--ray", action="store_true", help="accepted as in the scoring commands: training always runs on Ray"
    )
    add_options(ray, TrainResources)
    add_address(ray)


def train_options(args: argparse.Namespace) -> tuple[TrainOptions, TrainResources]:
    """The schedule and the Ray Train resources of `add_train_arguments`' flags."""
    from ...workflows.train.run import TrainOptions, TrainResources

    return options_from(args, TrainOptions), options_from(args, TrainResources, address=args.address)
