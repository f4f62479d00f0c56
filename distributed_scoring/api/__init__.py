"""The Python API: `MLMScorer` (score lists of texts, and Hugging Face datasets, in this process) and
`PLLStage` (a Ray Data stage for the user's own pipeline). See docs/python.md."""

from .pool import ActorPoolError
from .scorer import MLMScorer, UnknownTokensWarning
from .stages import PLLStage

__all__ = ["MLMScorer", "PLLStage", "ActorPoolError", "UnknownTokensWarning"]
