"""`dscore train maskless`: distil a PLL run into a student that predicts each PLL in one forward pass."""

from __future__ import annotations

import argparse

from ...config import ModelSpec
from ...errors import UserError
from ..common import add_options, finish, options_from
from .common import add_train_arguments, train_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ...workflows.train.maskless import LR, SPEED_SENTENCES
    from ...workflows.train.maskless_job import StudentOptions

    p.add_argument(
        "--teacher",
        required=True,
        metavar="SCORES_DIR",
        help="the --output folder of a `dscore score` run: its rows' PLLs are the targets (with "
        "--per-token for --target token, and --conditionals K too for --target distribution)",
    )
    add_options(p, StudentOptions)  # what the student learns and from which weights
    _add_report_arguments(p, SPEED_SENTENCES)
    add_train_arguments(p, lr=LR)


def _add_report_arguments(p: argparse.ArgumentParser, speed_sentences: int) -> None:
    """What the report measures beyond the held-out PLLs: N-best rescoring (`NBest`) and the speed against
    the PLL engine (`speed_sentences`: the default of --speed-sentences)."""
    from ...workflows.train.maskless_job import NBest

    p.add_argument(
        "--nbest-dev",
        default=None,
        help="an N-best list to tune rescoring weights on (as "
        "`dscore rescore --dev`): the report rescores it with teacher, student and unmasked",
    )
    p.add_argument("--nbest-test", default=None, help="the N-best list the tuned weights are applied to")
    add_options(p, NBest)
    p.add_argument(
        "--speed-sentences",
        type=int,
        default=speed_sentences,
        metavar="N",
        help=f"held-out rows the student and the PLL engine are timed on (default {speed_sentences})",
    )


def run(args: argparse.Namespace) -> int:
    from ...workflows.train.maskless import train_maskless
    from ...workflows.train.maskless_job import NBest, StudentOptions

    options, resources = train_options(args)
    model = ModelSpec(args.model, args.revision, trust_remote_code=args.trust_remote_code)
    student = options_from(args, StudentOptions)
    if (args.nbest_dev is None) != (args.nbest_test is None):
        raise UserError("--nbest-dev and --nbest-test go together: weights are tuned on dev and applied to test")
    nbest = options_from(args, NBest, dev=args.nbest_dev, test=args.nbest_test) if args.nbest_dev else None
    report = train_maskless(
        args.teacher,
        model,
        args.output,
        options,
        resources,
        args.overwrite,
        args.batch_tokens,
        student,
        nbest,
        args.speed_sentences,
    )
    return finish(args, report)
