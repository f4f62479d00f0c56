"""Process-wide quiet for transformers (no per-load progress bars or advisory warnings in logs), set by
the CLI on the driver and by every Ray actor. `import transformers` alone does not import torch.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


def quiet_transformers() -> None:
    """No per-load progress bars or advisory warnings from transformers (or torch) in logs (CLI, Ray actors)."""
    import transformers

    transformers.logging.set_verbosity_error()
    # torch's own INFO records (its fake-tensor cache statistics at exit, after a stopped command's last line)
    # would pass the CLI's INFO root logger.
    logging.getLogger("torch").setLevel(logging.WARNING)
    transformers.utils.logging.disable_progress_bar()


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off while a model loads (a bar per load in a notebook, where the Python API
    leaves the rest of transformers' settings as the user has them), as they were after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
