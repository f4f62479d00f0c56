"""What `dscore train maskless` is given and hands on: the student's options (`StudentOptions`), the N-best
lists rescored after training (`NBest`), and the job the training workers and the evaluation task receive
(`MasklessJob`). They sit beside the trainer (`maskless`), so that the reading of its teacher (`teacher`) and
its evaluation (`maskless_eval`) name them without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelSpec
from ...engine.model_files import TARGET_DISTRIBUTION, TARGET_TOKEN, TARGETS
from ...errors import UserError
from ...options import carried, check, option
from ..rescore.search import RescoreOptions
from .run import TrainOptions

DEFAULT_TARGET = TARGET_DISTRIBUTION  # the target that won on the demo's held-out report (docs/train.md)


@dataclass(frozen=True)
class StudentOptions:
    """What kind of student (all of it enters the run's fingerprint). `target`: `sentence` (the paper's
    regression of the PLL from the first token), `token` (each position's log q(w_t) regressed on the
    teacher's term) or `distribution` (each position's distribution fitted by KL to the teacher's
    conditional, plus `token_weight` times the token term). `parent_separator`: a row id `P<sep>...` is a
    variant of row `P`: both on the same side of the held-out split, compared in the report. `freeze_layers`:
    the embeddings and that many of the lowest transformer layers stay as they are. Each field declares its
    flag (`dscore train maskless`'s)."""

    target: str = option(
        DEFAULT_TARGET,
        "sentence: regress the PLL from the first token (Salazar et al.); token: regress each token's log "
        "q(w_t) on the teacher's term; distribution: fit each position's distribution to the teacher's "
        "conditional by KL (word-level distillation) (default {default})",
        choices=TARGETS,
    )
    parent_separator: str | None = option(
        None,
        "a row id P<SEP>... is a variant (a point mutant) of row P: both stay on the same side of the held-out "
        "split, and the report compares their differences (default: none)",
        metavar="SEP",
    )
    freeze_layers: int = option(
        0,
        "keep the embeddings and the N lowest transformer layers as they are (default {default})",
        low=0,
        metavar="N",
    )
    token_weight: float = option(
        1.0, "distribution: weight of the per-token squared error beside the KL (default {default:g})", low=0
    )

    def __post_init__(self) -> None:
        check(self)
        if self.parent_separator == "":
            raise UserError("--parent-separator must be a non-empty string")

    @property
    def weights(self) -> tuple[float, float]:
        """(token term, KL term) of a per-token student's loss."""
        return (1.0, 0.0) if self.target == TARGET_TOKEN else (self.token_weight, 1.0)


@dataclass(frozen=True)
class NBest:
    """N-best lists to rescore with the teacher, the student and `unmasked` after training (WER or BLEU by
    `metric`, `RescoreOptions`' own under another flag), e.g. built from held-out rows; None for no rescoring."""

    dev: str
    test: str
    metric: str = carried(RescoreOptions, "metric", name="--nbest-metric", help="rescoring metric (default {default})")

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class MasklessJob:
    """What the training workers and the evaluation task need (torch-free, pickled to them)."""

    model: ModelSpec
    location: str
    options: TrainOptions
    student: StudentOptions
    steps: int
    checkpoint_every: int
    mean: float
    std: float
    meta: dict
    variant: str
    batch_tokens: int | None
