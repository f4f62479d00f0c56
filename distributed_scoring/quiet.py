"""Process-wide quiet for transformers (no per-load progress bars or advisory warnings in logs), set by
the CLI on the driver and by every Ray actor. `import transformers` alone does not import torch.
"""

from __future__ import annotations


def quiet_transformers() -> None:
    """No per-load progress bars or advisory warnings from transformers in logs (CLI, Ray actors)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
