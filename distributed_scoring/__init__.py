"""distributed-scoring: exact, fast masked-LM scoring (PLL, PPPL), in one process or on a Ray cluster.

The public facade; the modules behind it each own one stage (see docs/ARCHITECTURE.md).
"""

from .config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from .errors import DataLossError, UserError

__all__ = ["InputSpec", "ModelSpec", "RayOptions", "RunConfig", "ScoringOptions", "UserError", "DataLossError", "score"]


def score(config: RunConfig, ray: RayOptions | None = None, overwrite: bool = False) -> dict:
    """PLL of every row of a corpus, in this process or on Ray; see `runner.score`."""
    from .workflows.score import score as _score

    return _score(config, ray, overwrite=overwrite)
