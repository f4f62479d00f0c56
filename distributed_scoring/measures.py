"""Corpus figures computed once from summed statistics, as sacrebleu and jiwer do: pseudo-perplexity.

PPPL = exp(-sum PLL / sum N) over the whole corpus (Salazar et al., 2020, sec. 2.3), never a mean of
per-sentence perplexities. Plain Python, so engines, workloads and the driver can all use it.
"""

from __future__ import annotations

import math


def pppl(sum_pll: float, count: int) -> float | None:
    """exp(-sum_pll / count); None when nothing was counted."""
    if count <= 0:
        return None
    return math.exp(-sum_pll / count)
