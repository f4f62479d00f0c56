"""distributed-scoring: exact, fast masked-LM scoring (PLL, PPPL), in one process or on a Ray cluster.

The public facade; the modules behind it each own one stage (see docs/ARCHITECTURE.md).
"""

from .config import InputSpec, ModelSpec, RunConfig, ScoringOptions
from .errors import DataLossError, UserError

__all__ = ["InputSpec", "ModelSpec", "RunConfig", "ScoringOptions", "UserError", "DataLossError", "run_local"]


def run_local(config: RunConfig, overwrite: bool = False, progress: bool | None = None) -> dict:
    """Score a corpus in this process; see `runner.run_local`."""
    from .runner import run_local as _run_local

    return _run_local(config, overwrite=overwrite, progress=progress)
