"""`dscore audit`: score a corpus snapshot as `dscore score` does, then audit it: PPPL per partition,
outliers, a verdict against a baseline; the exit code is the verdict."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import add_score_arguments, finish, ray_options, run_config, student_folder

if TYPE_CHECKING:
    from ..workflows.audit.figures import AuditResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_score_arguments(p, per_token_flag=False, maskless=True)
    _add_audit_arguments(p)


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("audit", "baseline comparison and outliers")
    _add_baseline_arguments(g)
    _add_outlier_arguments(g)


def _add_baseline_arguments(g: argparse._ArgumentGroup) -> None:
    """The baseline and the verdict against it, `Thresholds`' fields."""
    from ..workflows.audit.verdicts import EXIT_INSUFFICIENT, METRICS, Thresholds

    t = Thresholds()
    g.add_argument("--baseline", default=None, help="the previous run's audit.json (or its folder; path or URI)")
    g.add_argument(
        "--metric", choices=METRICS, default=t.metric, help=f"PPPL compared with the baseline (default {t.metric})"
    )
    g.add_argument(
        "--max-pppl-increase",
        type=float,
        default=t.max_pppl_increase,
        help=f"relative PPPL rise that counts as a regression (default {t.max_pppl_increase})",
    )
    g.add_argument(
        "--max-pppl-decrease",
        type=float,
        default=t.max_pppl_decrease,
        help="relative PPPL fall that also counts as a regression, a corpus that got suspiciously easy "
        "(default: none; a fall is an improvement)",
    )
    g.add_argument(
        "--max-error-rate-increase",
        type=float,
        default=t.max_error_rate_increase,
        help=f"absolute error-rate rise that counts as a regression (default {t.max_error_rate_increase})",
    )
    g.add_argument(
        "--min-rows",
        type=int,
        default=t.min_rows,
        help=f"a scope with fewer rows on either side is 'insufficient data' (default {t.min_rows})",
    )
    g.add_argument(
        "--confidence",
        type=float,
        default=t.confidence,
        help=f"confidence level of the intervals that verdicts are read from (default {t.confidence})",
    )
    g.add_argument("--seed", type=int, default=t.seed, help="seed of the bootstrap (recorded in audit.json)")
    g.add_argument(
        "--accept-insufficient",
        action="store_true",
        help=f"do not fail (exit {EXIT_INSUFFICIENT}) when some scope has too little data to judge",
    )


def _add_outlier_arguments(g: argparse._ArgumentGroup) -> None:
    """Which sentences are flagged as outliers, `OutlierRule`'s fields."""
    from ..workflows.audit.outliers import SCOPES, OutlierRule

    o = OutlierRule()
    g.add_argument(
        "--outlier-min-sigma",
        type=float,
        default=o.min_sigma,
        help=f"the smallest robust sigma, in nats per token, the outlier rule divides by (default "
        f"{o.min_sigma:g}; 0 for none): a partition of near-identical sentences measures a tiny one",
    )
    g.add_argument(
        "--outlier-k",
        type=float,
        default=o.k,
        help=f"flag sentences whose NLL/token is over median + k robust sigmas (default {o.k})",
    )
    g.add_argument(
        "--outlier-scope",
        choices=SCOPES,
        default=o.scope,
        help="one outlier rule per partition (default), or one for the whole corpus",
    )
    g.add_argument("--low-tail", action="store_true", help="also flag sentences far below the median NLL/token")


def run(args: argparse.Namespace) -> int:
    from ..workflows.audit.figures import AuditConfig
    from ..workflows.audit.outliers import OutlierRule
    from ..workflows.audit.run import audit_snapshot
    from ..workflows.audit.verdicts import Thresholds

    config = AuditConfig(
        outliers=OutlierRule(
            k=args.outlier_k, low_tail=args.low_tail, scope=args.outlier_scope, min_sigma=args.outlier_min_sigma
        ),
        thresholds=Thresholds(
            metric=args.metric,
            max_pppl_increase=args.max_pppl_increase,
            max_pppl_decrease=args.max_pppl_decrease,
            max_error_rate_increase=args.max_error_rate_increase,
            min_rows=args.min_rows,
            confidence=args.confidence,
            seed=args.seed,
            accept_insufficient=args.accept_insufficient,
        ),
    )
    result = audit_snapshot(
        run_config(args),
        ray_options(args),
        args.baseline,
        config,
        overwrite=args.overwrite,
        maskless=student_folder(args) is not None,
    )
    return finish(args, _result(result), result.exit_code)


def _result(result: AuditResult) -> dict[str, object]:
    """What `dscore audit` prints: the corpus figures, the verdict and what led to it, where the report is."""
    audit, comparison = result.record, result.comparison
    return {
        "rows": audit.overall.rows,
        "pppl_token": audit.overall.pppl_token,
        "pppl_word": audit.overall.pppl_word,
        "outliers": audit.outliers.count,
        "verdict": comparison.verdict if comparison else "no baseline",
        "regressed": [c.name for c in comparison.regressions] if comparison else [],
        "insufficient": [c.name for c in comparison.insufficient] if comparison else [],
        "scopes": {c.name: c.status for c in (comparison.overall, *comparison.partitions)} if comparison else {},
        "new_partitions": comparison.new_partitions if comparison else [],
        "vanished_partitions": comparison.vanished_partitions if comparison else [],
        "exit_code": result.exit_code,
        "report": result.report_path,
        **({"estimate": audit.estimate} if audit.estimate else {}),
    }
