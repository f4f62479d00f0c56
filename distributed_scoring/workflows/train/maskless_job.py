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
from .run import TrainOptions

DEFAULT_TARGET = TARGET_DISTRIBUTION  # the target that won on the demo's held-out report (docs/train.md)


@dataclass(frozen=True)
class StudentOptions:
    """What kind of student (all of it enters the run's fingerprint). `target`: `sentence` (the paper's
    regression of the PLL from the first token), `token` (each position's log q(w_t) regressed on the
    teacher's term) or `distribution` (each position's distribution fitted by KL to the teacher's
    conditional, plus `token_weight` times the token term). `parent_separator`: a row id `P<sep>...` is a
    variant of row `P`: both on the same side of the held-out split, compared in the report. `freeze_layers`:
    the embeddings and that many of the lowest transformer layers stay as they are."""

    target: str = DEFAULT_TARGET
    parent_separator: str | None = None
    freeze_layers: int = 0
    token_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UserError(f"--target {self.target!r} is not one of {', '.join(TARGETS)}")
        if self.parent_separator == "":
            raise UserError("--parent-separator must be a non-empty string")
        if self.freeze_layers < 0 or not self.token_weight >= 0:
            raise UserError(
                f"--freeze-layers and --token-weight must be >= 0, got {self.freeze_layers} and {self.token_weight}"
            )

    @property
    def weights(self) -> tuple[float, float]:
        """(token term, KL term) of a per-token student's loss."""
        return (1.0, 0.0) if self.target == TARGET_TOKEN else (self.token_weight, 1.0)


@dataclass(frozen=True)
class NBest:
    """N-best lists to rescore with the teacher, the student and `unmasked` after training (WER or BLEU
    by `metric`), e.g. built from held-out rows; None for no rescoring."""

    dev: str
    test: str
    metric: str = "wer"


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
