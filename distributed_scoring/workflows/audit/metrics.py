"""Tonight's figures and verdicts for a monitor (`dscore audit --metrics-file PATH`): the OpenMetrics text
format, which Prometheus scrapes and node_exporter's textfile collector reads from a folder.

Every metric is a gauge named `dscore_audit_*`, labelled by `scope` (`(overall)` or a partition) and `model`;
the rules' flags carry a `rule` label. The file is written whole (a temporary file renamed over it), so a
collector never reads half of it. docs/audit.md lists the metrics.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from ...errors import UserError
from ...io.storage import scheme
from .verdicts import OVERALL, REGRESSION

if TYPE_CHECKING:
    from .records import AuditRecord, ScopeFigures

__all__ = ["check_metrics_path", "openmetrics", "write_metrics"]

_SCOPE_GAUGES = (  # name, help, the figure of a scope
    ("rows", "rows audited tonight", lambda f: f.rows),
    ("errors", "rows that could not be scored tonight", lambda f: f.errors),
    ("error_rate", "share of rows that could not be scored", lambda f: f.error_rate),
    ("pppl_token", "pseudo-perplexity per token", lambda f: f.pppl_token),
    ("pppl_word", "pseudo-perplexity per word", lambda f: f.pppl_word),
    ("outliers", "rows the outlier rule flags", lambda f: f.outliers),
)
_RULES = ("rolling", "drift", "shape")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float | int | None) -> str | None:
    if value is None:
        return None
    return repr(float(value)) if isinstance(value, float) else str(value)


def openmetrics(audit: AuditRecord, exit_code: int) -> str:
    """The exposition of one audit: a family per figure, each with a sample per scope."""
    model = _model(audit)
    scopes: list[tuple[str, ScopeFigures]] = [(OVERALL, audit.overall), *sorted(audit.partitions.items())]
    lines: list[str] = []

    def family(name: str, help: str, samples: list[tuple[dict, float | int | None]]) -> None:
        shown = [(labels, _number(v)) for labels, v in samples if v is not None]
        if not shown:
            return
        lines.extend([f"# TYPE dscore_audit_{name} gauge", f"# HELP dscore_audit_{name} {help}"])
        lines.extend(f"dscore_audit_{name}{_labels(**labels)} {value}" for labels, value in shown)

    for name, help, figure in _SCOPE_GAUGES:
        family(name, help, [({"scope": s, "model": model}, figure(f)) for s, f in scopes])
    family(
        "exit_code",
        "the audit's exit code (0 pass, 3 regression, 4 scorer changed or incomparable, 5 insufficient data)",
        [({"model": model}, exit_code)],
    )
    series = audit.series
    if series is not None:
        flags = [
            ({"scope": s.name, "model": model, "rule": name}, int(rule.status == REGRESSION))
            for s in series.scopes
            for name, rule in s.rules()
        ]
        family("flagged", "1 when the rule flags the scope tonight against its history", flags)
        family(
            "tail_share",
            "share of rows above the reference nights' 90th percentile of NLL per token",
            [({"scope": s.name, "model": model}, s.shape.estimate) for s in series.scopes],
        )
        family(
            "reference_pppl",
            "the rolling reference: the median PPPL of the window's nights",
            [({"scope": s.name, "model": model}, s.rolling.reference) for s in series.scopes],
        )
        family(
            "scorer_changed",
            "1 when tonight starts a new segment of the history (scorer changed)",
            [({"model": model}, int(bool(series.scorer_changed)))],
        )
        family(
            "info",
            "the night and its segment",
            [({"model": model, "night": series.night, "segment": series.segment}, 1)],
        )
    return "\n".join([*lines, "# EOF"]) + "\n"


def _model(audit: AuditRecord) -> str:
    signature = audit.signature
    return str(signature.get("model") if isinstance(signature, dict) else "(several)")


def check_metrics_path(path: str) -> str:
    """The local path of the metrics file (checked before any work): a collector reads a local file."""
    if scheme(path) not in (None, "file"):
        raise UserError(f"metrics file {path}: a collector reads a local file; give a local path")
    return path.removeprefix("file://")


def write_metrics(path: str, audit: AuditRecord, exit_code: int) -> None:
    """Write the exposition at `path` whole: a temporary file beside it, renamed over it."""
    path = check_metrics_path(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".dscore-metrics-", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(openmetrics(audit, exit_code))
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        raise UserError(f"metrics file {path}: cannot write it ({exc}); give a path you can write") from exc
