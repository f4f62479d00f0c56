"""Auditing a corpus snapshot (`dscore audit`): score it (in this process, or on Ray), then audit the rows.

Scoring keeps per-token log-probabilities (for positionwise cross-entropy and outliers' hardest tokens)
and a partition per row: the value of `--partition-column`, else the input file's name. With `maskless`
the rows are a maskless student's predictions (`dscore audit --maskless DIR`, a fast screening audit; its
per-token terms where the student predicts them), and audit.json and the report say they are its estimate.
The audit then streams over the rows of `DIR/rows` and writes `audit.json`, `row_stats.parquet`,
`outliers.parquet` and `report.html` beside them, all under the lock the scoring run took (they are the
run's own outputs).
"""

from __future__ import annotations

from dataclasses import replace

from ...config import RayOptions, RunConfig
from ...errors import UserError
from ...io.claim import claim
from ...io.sources import plan_shards
from ..maskless import score_maskless
from ..score import score
from .baseline_io import load_baseline
from .figures import AUDIT_OUTPUTS, AuditConfig, AuditResult, run_audit


def audit_snapshot(
    config: RunConfig,
    ray: RayOptions | None = None,
    baseline: str | None = None,
    audit: AuditConfig = AuditConfig(),
    overwrite: bool = False,
    maskless: bool = False,
) -> AuditResult:
    """Score (on Ray when `ray` options are given; resuming an interrupted run) and audit; the result's
    `exit_code` is the command's. With `maskless`, `config.model` is a student folder."""
    from ...engine.model_files import TARGET_SENTENCE, read_student_info

    inputs = config.inputs
    if inputs.partition_column is None and not inputs.partition_by_file:
        inputs = replace(inputs, partition_by_file=True)
    if baseline:
        load_baseline(baseline)  # a bad baseline fails before the snapshot is scored, not after
    if not any(shard.rows for shard in plan_shards(inputs)):  # (planned again by the run: a read of the input)
        raise UserError(f"{', '.join(inputs.paths)}: no rows to audit (the input is empty); check the snapshot's files")
    per_token = not maskless or read_student_info(config.model.name)["target"] != TARGET_SENTENCE
    scored = replace(config, inputs=inputs, scoring=replace(config.scoring, per_token=per_token))
    with claim(scored.output, [*inputs.paths, *([baseline] if baseline else [])], [config.model.name]) as folder:
        folder.declare(*AUDIT_OUTPUTS)
        (score_maskless if maskless else score)(scored, ray, overwrite=overwrite, folder=folder)
        return run_audit(scored.output, scored.output, baseline, audit, folder)
