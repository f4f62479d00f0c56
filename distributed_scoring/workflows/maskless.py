"""One forward pass per sentence: `dscore score --maskless DIR` (a student's predicted PLLs) and `dscore score
--method unmasked` (the masked LM read unmasked), in the PLL's rows and summary. `summary.json` says which:
`variant` (and `method`) `maskless` or `unmasked`; a student's summary adds its target, its teacher, its
held-out figures, the calibration its predictions passed through (a warning when it has none) and how many
rows it predicted outside the range of its training rows, with a warning."""

from __future__ import annotations

import logging

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..config import RayOptions, RunConfig
from ..engine.model_files import CALIBRATION, student_calibration
from ..errors import UserError
from ..io import schema as S
from ..io.claim import Claim
from ..io.output import OutputDir
from ..io.sources import Shard
from ..pipeline.runner import Finished, run
from ..workloads.maskless import MASKLESS, RANGE, UNMASKED, maskless_workload
from ..workloads.pll import row_cost
from .score import pll_summary

logger = logging.getLogger(__name__)

HELDOUT = "heldout"  # maskless.json: the student's held-out figures against its teacher (`dscore train maskless`)


def score_maskless(
    config: RunConfig,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    folder: Claim | None = None,
) -> dict:
    """Predicted PLL of every input row, `config.model` naming the student folder; returns the summary.
    `folder`: the output folder, when the caller holds it (as `workflows.score.score`).

    The student's files and tokenizer are checked here first, so a folder that is no student, a tokenizer
    that is not the student's, or --per-token asked of a student that predicts sentences only stops the run
    before any file is written.
    """
    info = check_student(config)
    workload = maskless_workload(config.model, config.scoring, MASKLESS)
    uncalibrated = [uncalibrated_warning(config.model.name, info)] if student_calibration(info) is None else []
    for warning in uncalibrated:
        logger.warning(warning)
    return run(
        config,
        workload,
        ray,
        overwrite,
        progress=progress,
        folder=folder,
        summarise=lambda done: student_summary(done, info, uncalibrated),
    )


def student_summary(done: Finished, info: dict, uncalibrated: list[str]) -> dict:
    """The PLL's summary of a student's predictions, with what the student is (`info`, its maskless.json)
    and how far to trust them: the warnings `uncalibrated` and one for rows outside its training range."""
    summary = pll_summary(done)
    outside = count_out_of_range(done.out, done.plan)
    span = info.get(RANGE, {}).get("pll_per_token")
    warnings = summary["warnings"] + uncalibrated + ([range_warning(outside, summary["ok"], span)] if outside else [])
    if outside:
        logger.warning(warnings[-1])
    return {
        **summary,
        "variant": MASKLESS,
        "method": MASKLESS,
        "target": info["target"],
        "teacher": info.get("teacher"),
        "heldout": info.get(HELDOUT),
        CALIBRATION: info.get(CALIBRATION),
        "out_of_range": outside,
        "training_range": {"pll_per_token": span},
        "warnings": warnings,
    }


def score_unmasked(
    config: RunConfig,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    folder: Claim | None = None,
) -> dict:
    """One pass of the masked LM over every unmasked row: sum over scored tokens of log p(w_t | W)."""
    from ..engine.model_files import load_tokenizer

    load_tokenizer(config.model)
    cost = row_cost(config.model, passes_per_token=0.0, passes_per_row=1.0)
    workload = maskless_workload(config.model, config.scoring, UNMASKED, cost)
    return run(
        config,
        workload,
        ray,
        overwrite,
        progress=progress,
        folder=folder,
        summarise=lambda done: {**pll_summary(done), "variant": UNMASKED, "method": UNMASKED},
    )


def check_student(config: RunConfig) -> dict:
    """The student's maskless.json, after the checks that need no weights."""
    from ..engine.model_files import check_student_tokenizer, load_tokenizer, read_student_info

    info = read_student_info(config.model.name)
    if config.scoring.per_token and info["target"] == "sentence":
        raise UserError(
            f"{config.model.name!r} is a `sentence` student: it predicts each sentence's PLL, not its "
            "tokens' terms; drop --per-token, or train a `--target token` or `distribution` student"
        )
    if bool(info.get("split_chars")) != config.scoring.split_chars:
        logger.warning(
            "the student was trained on texts %s --split-chars; this run tokenises them %s it",
            "with" if info.get("split_chars") else "without",
            "with" if config.scoring.split_chars else "without",
        )
    tokenizer, _ = load_tokenizer(config.model)
    check_student_tokenizer(config.model.name, info, tokenizer)
    return info


def count_out_of_range(out: OutputDir, plan: list[Shard]) -> int:
    """Rows whose prediction lies outside the student's training range."""
    return sum(
        int(
            pc.sum(
                pq.read_table(out.part_path(s.key), columns=[S.OUT_OF_RANGE], filesystem=out.fs)[S.OUT_OF_RANGE].cast(
                    "int64"
                )
            ).as_py()
            or 0
        )
        for s in plan
    )


def uncalibrated_warning(name: str, info: dict) -> str:
    """The warning for a student that records no calibration: its raw predictions can be biased."""
    return (
        f"student {name!r} (maskless.json format {info.get('format')}) has no calibration: its PLLs are its raw "
        "predictions, whose corpus PPPL can be several percent off its teacher's; train it again with this "
        "dscore (`dscore train maskless`) to have it calibrated on its held-out rows"
    )


def range_warning(outside: int, ok: int, span: list[float] | None) -> str:
    """The summary's warning for rows a student predicted outside its training range."""
    return (
        f"{outside} of {ok} rows have a predicted PLL per token outside [{span[0]:.4g}, {span[1]:.4g}], the range "
        "of the teacher's training rows (see the out_of_range column): the student extrapolates there, so "
        "their scores are less reliable; score them with the teacher (`dscore score --model`) if they matter"
    )
