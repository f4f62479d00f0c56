"""The Python API: `MLMScorer` (score lists of texts, and Hugging Face datasets, in this process) and
`PLLStage`, `VariantsStage` (Ray Data stages for the user's own pipeline). See docs/python.md."""

from .pool import ActorPoolError
from .scorer import MLMScorer, UnknownTokensWarning
from .stages import PLLStage, VariantsStage

__all__ = ["MLMScorer", "PLLStage", "VariantsStage", "ActorPoolError", "UnknownTokensWarning"]
