"""`dscore train maskless`: distil a PLL run into a student that predicts each PLL in one forward pass."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...config import ModelSpec
from ...errors import UserError
from ..common import finish
from .common import add_train_arguments, train_options

if TYPE_CHECKING:
    from ...workflows.train.maskless_job import StudentOptions


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
    _add_student_arguments(p, StudentOptions())
    _add_report_arguments(p, SPEED_SENTENCES)
    add_train_arguments(p, lr=LR)


def _add_student_arguments(p: argparse.ArgumentParser, student: StudentOptions) -> None:
    """What the student learns and from which weights, `StudentOptions`' fields; `student` gives the
    defaults."""
    from ...engine.model_files import TARGETS

    p.add_argument(
        "--target",
        choices=TARGETS,
        default=student.target,
        help="sentence: regress the PLL from the first token (Salazar et al.); token: regress each "
        "token's log q(w_t) on the teacher's term; distribution: fit each position's distribution "
        f"to the teacher's conditional by KL (word-level distillation) (default {student.target})",
    )
    p.add_argument(
        "--parent-separator",
        default=None,
        metavar="SEP",
        help="a row id P<SEP>... is a variant (a point mutant) of row P: both stay on the same side "
        "of the held-out split, and the report compares their differences (default: none)",
    )
    p.add_argument(
        "--freeze-layers",
        type=int,
        default=student.freeze_layers,
        metavar="N",
        help="keep the embeddings and the N lowest transformer layers as they are (default 0)",
    )
    p.add_argument(
        "--token-weight",
        type=float,
        default=student.token_weight,
        help=f"distribution: weight of the per-token squared error beside the KL (default {student.token_weight:g})",
    )


def _add_report_arguments(p: argparse.ArgumentParser, speed_sentences: int) -> None:
    """What the report measures beyond the held-out PLLs: N-best rescoring and the speed against the PLL
    engine (`speed_sentences`: the default of --speed-sentences)."""
    p.add_argument(
        "--nbest-dev",
        default=None,
        help="an N-best list to tune rescoring weights on (as "
        "`dscore rescore --dev`): the report rescores it with teacher, student and unmasked",
    )
    p.add_argument("--nbest-test", default=None, help="the N-best list the tuned weights are applied to")
    p.add_argument("--nbest-metric", choices=("wer", "bleu"), default="wer", help="rescoring metric (default wer)")
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
    student = StudentOptions(args.target, args.parent_separator, args.freeze_layers, args.token_weight)
    if (args.nbest_dev is None) != (args.nbest_test is None):
        raise UserError("--nbest-dev and --nbest-test go together: weights are tuned on dev and applied to test")
    nbest = NBest(args.nbest_dev, args.nbest_test, args.nbest_metric) if args.nbest_dev else None
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
