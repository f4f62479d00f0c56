"""Process-wide quiet for transformers (no per-load progress bars or advisory warnings in logs), set by
the CLI on the driver and by every Ray actor. `import transformers` alone does not import torch.
"""

from __future__ import annotations

import logging


def quiet_transformers() -> None:
    """No per-load progress bars or advisory warnings from transformers (or torch) in logs (CLI, Ray actors)."""
    import transformers

    transformers.logging.set_verbosity_error()
    # torch's own INFO records (its fake-tensor cache statistics at exit, after a stopped command's last line)
    # would pass the CLI's INFO root logger.
    logging.getLogger("torch").setLevel(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()
