"""The Python API: `MLMScorer` (score lists of texts, and Hugging Face datasets, in this process) and
`PLLStage`, `VariantsStage` (Ray Data stages for the user's own pipeline), `ray_messages_to_file` (Ray's
own messages to a log file while those run). See docs/python.md."""

from .pool import ActorPoolError
from .ray_messages import ray_messages_to_file
from .scorer import MLMScorer, UnknownTokensWarning
from .stages import PLLStage, VariantsStage

__all__ = ["MLMScorer", "PLLStage", "VariantsStage", "ActorPoolError", "UnknownTokensWarning", "ray_messages_to_file"]
