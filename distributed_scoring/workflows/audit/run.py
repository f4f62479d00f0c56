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

import datetime
import hashlib
import json
from dataclasses import replace

from ...config import RayOptions, RunConfig
from ...errors import UserError
from ...io.claim import claim
from ...io.sources import plan_shards
from ..maskless import score_maskless
from ..score import score
from .baseline_io import load_baseline
from .figures import AUDIT_OUTPUTS, AuditConfig, AuditResult, run_audit
from .history import check_night
from .metrics import check_metrics_path, write_metrics
from .nightly import CANARY_DIR, SeriesInputs


def audit_snapshot(
    config: RunConfig,
    ray: RayOptions | None = None,
    baseline: str | None = None,
    audit: AuditConfig = AuditConfig(),
    overwrite: bool = False,
    maskless: bool = False,
    series: SeriesInputs | None = None,
    metrics_file: str | None = None,
) -> AuditResult:
    """Score (on Ray when `ray` options are given; resuming an interrupted run) and audit; the result's
    `exit_code` is the command's. With `maskless`, `config.model` is a student folder. With `series`, tonight
    joins its history (the canary scored apart, in `DIR/canary`); `metrics_file` gets tonight's figures and
    verdicts in the OpenMetrics text format."""
    from ...engine.model_files import TARGET_SENTENCE, files_digest, read_student_info

    inputs = config.inputs
    if inputs.partition_column is None and not inputs.partition_by_file:
        inputs = replace(inputs, partition_by_file=True)
    if baseline:
        load_baseline(baseline)  # a bad baseline fails before the snapshot is scored, not after
    if series is not None:
        series = replace(series, night=check_night(series.night or _today()))
    if metrics_file:
        check_metrics_path(metrics_file)
    if not any(shard.rows for shard in plan_shards(inputs)):  # (planned again by the run: a read of the input)
        raise UserError(f"{', '.join(inputs.paths)}: no rows to audit (the input is empty); check the snapshot's files")
    per_token = not maskless or read_student_info(config.model.name)["target"] != TARGET_SENTENCE
    scored = replace(config, inputs=inputs, scoring=replace(config.scoring, per_token=per_token))
    scorer = score_maskless if maskless else score
    sources = [*inputs.paths, *([baseline] if baseline else []), *([series.canary] if series and series.canary else [])]
    with claim(scored.output, sources, [config.model.name]) as folder:
        folder.declare(*AUDIT_OUTPUTS)
        scorer(scored, ray, overwrite=overwrite, folder=folder)
        if series is not None:
            fingerprint = json.dumps([(folder.run or {}).get(k) for k in ("inputs", "plan")]).encode()
            series = replace(
                series,
                weights=files_digest(config.model),
                input_fingerprint=hashlib.sha256(fingerprint).hexdigest()[:16],
            )
            if series.canary:
                canary = replace(inputs, paths=(series.canary,), partition_column=None, partition_by_file=False)
                canary_run = replace(scored, inputs=canary, output=folder.subfolder(CANARY_DIR))
                scorer(canary_run, ray, overwrite=overwrite)
                series = replace(series, canary_rows=canary_run.output)
        result = run_audit(scored.output, scored.output, baseline, audit, folder, series)
    if metrics_file:
        write_metrics(metrics_file, result.record, result.exit_code)
    return result


def _today() -> str:
    """The default night: the UTC date of the run."""
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()
