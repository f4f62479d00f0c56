"""The memory a run's options make it need, printed and checked against this machine's free memory before
any work.

Most of what a run holds is fixed: the model, and one forward pass under `--batch-tokens`. What grows with
a command's options is what one shard holds at once in its score stage, since a shard is scored and
written whole: its output rows (`sample`: chains x recorded epochs per input row; `generate`: sequences
per prompt; chain scoring: a log-likelihood per order), and the state of a search (`infill`: beams or
every fill of `exact`, each a copy of the tokens and its candidates). Each workload estimates that from
its options with the sizes below (`workloads/*.memory_estimate`); the workflow calls `check_memory`,
which logs the estimate and refuses, naming the flags to lower, what this machine cannot hold. On Ray
every scoring actor holds one shard at a time, so the estimate is per scoring process. The sizes are
rough (the order of magnitude is what tells 20 MiB from 400 TiB); texts are assumed `TYPICAL_TOKENS`
long, or the model's maximum when that is shorter, since planning does not tokenise the inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import UserError

logger = logging.getLogger(__name__)

ROW_BYTES = 1024  # one output row as a Python dict of a dozen values, before it becomes Arrow
TOKEN_BYTES = 64  # one token of a written row: its id, its string in a list, its characters in a text
BEAM_BYTES = 256  # one partial fill of a search, beside its token ids (8 bytes each)
CANDIDATE_BYTES = 16  # one candidate token of a search step: its id and log-probability
TYPICAL_TOKENS = 128  # tokens assumed per input text


@dataclass(frozen=True)
class MemoryEstimate:
    """`bytes` one shard needs at once; `what` they hold (for people); `flags`, the options that lower it."""

    bytes: float
    what: str
    flags: str


def text_tokens(max_length: int) -> int:
    """The tokens a text is assumed to have: `TYPICAL_TOKENS`, or the model's maximum when shorter."""
    return min(max_length, TYPICAL_TOKENS)


def available_memory() -> int:
    """Bytes this machine can still give a process without swapping (free plus reclaimable caches)."""
    import psutil

    return psutil.virtual_memory().available


def check_memory(command: str, estimate: MemoryEstimate) -> None:
    """Log the estimate; refuse, before any work, a run whose shard needs more memory than is free now."""
    free = available_memory()
    logger.info(
        "memory: %s needs about %s for %s (%s free on this machine)",
        command,
        size(estimate.bytes),
        estimate.what,
        size(free),
    )
    if estimate.bytes > free:
        raise UserError(
            f"{command} would need about {size(estimate.bytes)} of memory for {estimate.what}, more than the "
            f"{size(free)} this machine has free: lower {estimate.flags}"
        )


def size(n_bytes: float) -> str:
    """`n_bytes` in binary units, three significant digits: `4.6 MiB`, `1010 GiB`, `412 TiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n_bytes < 1024:
            return f"{n_bytes:.3g} {unit}" if n_bytes < 1000 else f"{n_bytes:.0f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.3g} PiB"
