"""`dscore audit`: score a corpus snapshot as `dscore score` does, then audit it: PPPL per partition,
outliers, a verdict against a baseline; the exit code is the verdict."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import UserError
from .common import (
    Command,
    add_options,
    add_score_arguments,
    finish,
    options_from,
    ray_options,
    run_config,
    student_folder,
)

if TYPE_CHECKING:
    from ..workflows.audit.figures import AuditResult
    from ..workflows.audit.nightly import SeriesRecord


COMMAND = Command(
    "audit",
    "score a corpus snapshot and audit it: PPPL per partition, outliers, baseline",
    description="Scores in this process, or on Ray with --ray or --address (as `dscore score`). Exit codes: 0 pass "
    "(every scope shows no change or an improvement, or no baseline; with --history, too few nights to judge), "
    "3 a regression against the baseline or the history (rolling, drift or shape), 5 insufficient data (some "
    "scope's interval cannot tell; --accept-insufficient turns it into a pass), 4 the baseline was scored by "
    "another model (PPPL not compared) or, with --history, the scorer changed tonight (a new segment), 1 rows "
    "lost, 2 bad input or options.",
    place=70,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_score_arguments(p, per_token_flag=False, maskless=True)
    _add_audit_arguments(p)


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """The "audit" group: the baseline, the verdict against it (`Thresholds`) and which sentences are
    flagged as outliers (`OutlierRule`), each declared with its field."""
    from ..workflows.audit.outliers import OutlierRule
    from ..workflows.audit.series import SeriesRules
    from ..workflows.audit.verdicts import Thresholds

    g = p.add_argument_group("audit", "baseline comparison and outliers")
    g.add_argument("--baseline", default=None, help="the previous run's audit.json (or its folder; path or URI)")
    add_options(g, Thresholds)
    add_options(g, OutlierRule, ["min_sigma", "k", "scope", "low_tail"])
    h = p.add_argument_group("series", "the nightly audit as a series of nights (docs/audit.md)")
    h.add_argument(
        "--history",
        default=None,
        metavar="HIST",
        help="append tonight to this history (a folder or "
        "URI; a Parquet dataset) and judge it against the nights before it: rolling, drift, shape",
    )
    h.add_argument(
        "--night",
        default=None,
        metavar="LABEL",
        help="tonight's label in the history (default: the UTC date); a rerun of a night replaces it",
    )
    h.add_argument(
        "--canary",
        default=None,
        metavar="FILE",
        help="texts scored every night apart from the corpus: "
        "if their PLLs move, the scorer changed (exit 4, a new segment)",
    )
    h.add_argument(
        "--metrics-file",
        default=None,
        metavar="PATH",
        help="write tonight's figures and verdicts "
        "there in the OpenMetrics text format (for node_exporter's textfile collector)",
    )
    add_options(h, SeriesRules)


def run(args: argparse.Namespace) -> int:
    from ..workflows.audit.figures import AuditConfig
    from ..workflows.audit.nightly import SeriesInputs
    from ..workflows.audit.outliers import OutlierRule
    from ..workflows.audit.run import audit_snapshot
    from ..workflows.audit.series import SeriesRules
    from ..workflows.audit.verdicts import Thresholds

    if args.history is None and (args.night or args.canary):
        raise UserError("--night and --canary belong to a history: pass --history HIST with them")
    series = None
    if args.history is not None:
        series = SeriesInputs(args.history, args.night, options_from(args, SeriesRules), args.canary)
    config = AuditConfig(outliers=options_from(args, OutlierRule), thresholds=options_from(args, Thresholds))
    result = audit_snapshot(
        run_config(args),
        ray_options(args),
        args.baseline,
        config,
        overwrite=args.overwrite,
        maskless=student_folder(args) is not None,
        series=series,
        metrics_file=args.metrics_file,
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
        "unknown_tokens": audit.unknown_tokens.count if audit.unknown_tokens else 0,  # junk, counted apart
        "verdict": comparison.verdict if comparison else "no baseline",
        "regressed": [c.name for c in comparison.regressions] if comparison else [],
        "insufficient": [c.name for c in comparison.insufficient] if comparison else [],
        "scopes": {c.name: c.status for c in (comparison.overall, *comparison.partitions)} if comparison else {},
        "new_partitions": comparison.new_partitions if comparison else [],
        "vanished_partitions": comparison.vanished_partitions if comparison else [],
        "exit_code": result.exit_code,
        **({"series": _series(audit.series)} if audit.series else {}),
        "report": result.report_path,
        **({"estimate": audit.estimate} if audit.estimate else {}),
    }


def _series(series: SeriesRecord) -> dict[str, object]:
    """What `dscore audit --history` adds to its output: tonight's place and verdict in the series."""
    return {
        "history": series.history,
        "night": series.night,
        "segment": series.segment,
        "verdict": series.verdict,
        "scorer_changed": series.scorer_changed,
        "flagged": {s.name: list(s.flagged) for s in series.regressions},
        "events": [f"{e['scope']} {e['event']}" for e in series.events],
    }
