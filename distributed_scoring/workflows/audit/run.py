"""Auditing a corpus snapshot (`dscore audit`): score it (in this process, or on Ray), then audit the rows.

Scoring keeps per-token log-probabilities (for positionwise cross-entropy and outliers' hardest tokens)
and a partition per row: the value of `--partition-column`, else the input file's name. The audit then
streams over the rows of `DIR/rows` and writes `audit.json`, `row_stats.parquet`, `outliers.parquet` and
`report.html` beside them, all under the lock the scoring run took (they are the run's own outputs).
"""

from __future__ import annotations

from dataclasses import replace

from .figures import AUDIT_OUTPUTS, AuditConfig, AuditResult, run_audit
from .baseline import load_baseline
from ...config import RayOptions, RunConfig
from ...io.claim import claim
from ..score import score


def audit_snapshot(config: RunConfig, ray: RayOptions | None = None, baseline: str | None = None,
                   audit: AuditConfig = AuditConfig(), overwrite: bool = False) -> AuditResult:
    """Score (on Ray when `ray` options are given; resuming an interrupted run) and audit; the result's
    `exit_code` is the command's."""
    inputs = config.inputs
    if inputs.partition_column is None and not inputs.partition_by_file:
        inputs = replace(inputs, partition_by_file=True)
    if baseline:
        load_baseline(baseline)  # a bad baseline fails before the snapshot is scored, not after
    scoring = replace(config.scoring, per_token=True)
    scored = replace(config, inputs=inputs, scoring=scoring)
    with claim(scored.output, [*inputs.paths, *([baseline] if baseline else [])], [config.model.name]) as folder:
        folder.declare(*AUDIT_OUTPUTS)
        score(scored, ray, overwrite=overwrite, folder=folder)
        return run_audit(scored.output, scored.output, baseline, audit, folder)
