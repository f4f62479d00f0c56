"""`dscore score`: the PLL of every input row, then the corpus summary (summary.json)."""

from __future__ import annotations

from ..config import RayOptions, RunConfig
from ..io.claim import Claim
from ..pipeline.aggregate import corpus_summary
from ..pipeline.runner import Finished, run
from ..workloads.pll import pll_workload, row_cost


def score(
    config: RunConfig,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    folder: Claim | None = None,
) -> dict:
    """PLL of every input row; returns the summary (also written to summary.json). `folder`: the output
    folder, when the caller holds it (to write its own files there after the run, as the audit does).

    The model's configuration and tokenizer are loaded here first, so a model that cannot be used
    stops the run before any file is written (on Ray, actors would only fail later, one by one).
    """
    from ..engine.model_files import load_tokenizer

    load_tokenizer(config.model)
    workload = pll_workload(config.model, config.scoring, row_cost(config.model, passes_per_token=1.0))
    return run(config, workload, ray, overwrite, progress=progress, folder=folder, summarise=pll_summary)


def pll_summary(done: Finished) -> dict:
    """summary.json of a run of PLL rows (`score`'s, and the maskless runs' in the same layout)."""
    return corpus_summary(done.out, done.plan, done.config, done.markers)
