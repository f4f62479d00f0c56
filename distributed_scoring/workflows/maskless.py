"""`dscore score --maskless DIR`: every input row's PLL predicted by a maskless student in one forward
pass, in the PLL's rows and summary (`summary.json` says `variant: maskless`: its PPPLs are of predicted
PLLs)."""

from __future__ import annotations

import logging

from ..config import RayOptions, RunConfig
from ..io.output import SUMMARY_FILE
from ..pipeline.aggregate import summarize
from ..pipeline.runner import claimed, execute
from ..workloads.maskless import VARIANT, maskless_workload

logger = logging.getLogger(__name__)


def score_maskless(config: RunConfig, ray: RayOptions | None = None, overwrite: bool = False,
                   progress: bool | None = None) -> dict:
    """Predicted PLL of every input row, `config.model` naming the student folder; returns the summary.

    The student's files and tokenizer are checked here first, so a folder that is no student stops the
    run before any file is written.
    """
    from ..engine.model_files import load_tokenizer, read_student_info

    info = read_student_info(config.model.name)
    if bool(info.get("split_chars")) != config.scoring.split_chars:
        logger.warning("the student was trained on texts %s --split-chars; this run tokenises them %s it",
                       "with" if info.get("split_chars") else "without",
                       "with" if config.scoring.split_chars else "without")
    load_tokenizer(config.model)
    workload = maskless_workload(config.model, config.scoring)
    with claimed(config, workload, overwrite, (SUMMARY_FILE,)) as (plan, out, todo):
        execute(workload, config, todo, out, ray, progress)
        summary = {**summarize(out, plan, config), "variant": VARIANT}
        out.write_json(SUMMARY_FILE, summary)
        return summary
