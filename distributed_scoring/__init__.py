"""distributed-scoring: exact, fast masked-LM scoring (PLL, PPPL), in one process or on a Ray cluster.

The public facade; the modules behind it each own one stage (see docs/ARCHITECTURE.md). `MLMScorer`,
`PLLStage`, `VariantsStage` and `ray_messages_to_file` (the Python API, docs/python.md) are imported on first
use, so that `import distributed_scoring` stays light.
"""

from typing import Any

from .config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from .errors import DataLossError, UserError

__all__ = [
    "InputSpec",
    "ModelSpec",
    "RayOptions",
    "RunConfig",
    "ScoringOptions",
    "UserError",
    "DataLossError",
    "score",
    "MLMScorer",
    "PLLStage",
    "VariantsStage",
    "ray_messages_to_file",
]


def __getattr__(name: str) -> Any:
    if name in ("MLMScorer", "PLLStage", "VariantsStage", "ray_messages_to_file"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def score(config: RunConfig, ray: RayOptions | None = None, overwrite: bool = False) -> dict:
    """PLL of every row of a corpus, in this process or on Ray; see `workflows.score.score`."""
    from .workflows.score import score as _score

    return _score(config, ray, overwrite=overwrite)
