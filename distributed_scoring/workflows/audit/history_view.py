"""`dscore history HIST`: the series read back (a table on the terminal, `trend.html`), and earlier audits'
folders added to it (`--add`), so a team with months of audit folders starts with its series.

The series is read one night's file at a time, keeping only the figures the table and the charts show: memory
grows with nights x scopes of a few numbers each, never with the histograms or the canary's lists.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import pyarrow.parquet as pq

from ...errors import UserError
from ...io.output import OutputDir
from ...io.storage import join
from .baseline import AUDIT_FILE
from .history import CANARY, History
from .nightly import CANARY_DIR, Canary, SeriesRecord, Tonight, judge_night, scorer_identity
from .records import AuditRecord
from .row_stats import ROW_STATS_FILE
from .series import SeriesRules
from .trend import Point, ScopeTrend, render_trend
from .verdicts import OVERALL, Thresholds

__all__ = ["HistoryView", "add_audits", "read_series", "show_history"]

logger = logging.getLogger(__name__)

_COLUMNS = [
    "night",
    "segment",
    "scope",
    "event",
    "rows",
    "metric",
    "pppl_token",
    "pppl_word",
    "error_rate",
    "tail_share",
    "reference_pppl",
    "pppl_band",
    "rolling",
    "drift",
    "shape",
    "series_status",
    "verdict",
    "exit_code",
]


_SHORT = {  # a rule's status in the terminal's table
    "regression": "REGRESSION",
    "improvement": "improved",
    "no change": "ok",
    "insufficient data": "can't tell",
    "insufficient history": "few nights",
}


@dataclass(frozen=True)
class HistoryView:
    """What `dscore history` found: the nights, the series per scope (the corpus first), what it added."""

    history: str
    nights: list[dict]  # the corpus row of each night, in order
    trends: list[ScopeTrend]
    added: list[str]
    trend_path: str | None

    def table(self, last: int = 30) -> str:
        """The corpus per night, the latest `last` nights, as fixed-width text."""
        head = f"{'night':<14}{'rows':>9}{'pppl':>11}{'errors':>9}{'tail':>8}  "
        lines = [head + f"{'rolling':<12}{'drift':<12}{'shape':<12}verdict"]
        segment = None
        for row in self.nights[-last:]:
            if segment is not None and row["segment"] != segment:
                lines.append(f"-- new segment from {row['segment']} (the scorer changed)")
            segment = row["segment"]
            pppl = row.get(row.get("metric") or "pppl_token")
            lines.append(
                f"{row['night']:<14}{row['rows'] or 0:>9}{_f(pppl, '.4g'):>11}{_f(row['error_rate'], '.2%'):>9}"
                f"{_f(row['tail_share'], '.1%'):>8}  "
                + "".join(f"{_SHORT.get(row.get(rule), '-'):<12}" for rule in ("rolling", "drift", "shape"))
                + (row["verdict"] or "-")
            )
        if len(self.nights) > last:
            lines.insert(1, f"({len(self.nights) - last} earlier nights not shown; trend.html has them all)")
        return "\n".join(lines)


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def read_series(history: History) -> tuple[list[dict], list[ScopeTrend]]:
    """Every night's corpus row, and each scope's points (the corpus first, the canary left out)."""
    nights = history.nights()
    if not nights:
        raise UserError(f"{history.uri} holds no night: add one with `dscore audit ... --history` or `--add`")
    corpus: list[dict] = []
    trends: dict[str, ScopeTrend] = {OVERALL: ScopeTrend(OVERALL)}
    for night in nights:
        rows = history.read(night, _COLUMNS).to_pylist()
        for row in rows:
            if row["scope"] == CANARY:
                continue
            if row["scope"] == OVERALL:
                corpus.append(row)
            pppl = row.get(row.get("metric") or "pppl_token")
            point = Point(
                night,
                row["segment"],
                pppl,
                row["error_rate"],
                row["tail_share"],
                row["reference_pppl"],
                row["pppl_band"],
                row["series_status"],
                row["event"],
            )
            trends.setdefault(row["scope"], ScopeTrend(row["scope"])).points.append(point)
    return corpus, [trends.pop(OVERALL), *trends.values()]


def show_history(
    uri: str,
    add: tuple[str, ...] = (),
    trend: str | None = "trend.html",
    rules: SeriesRules | None = None,
) -> HistoryView:
    """Add the audits of `add` (oldest first), then read the series back and write `trend` (a local path)."""
    history = History(uri)
    added = add_audits(history, add, rules or SeriesRules()) if add else []
    corpus, trends = read_series(history)
    if trend:
        try:
            with open(trend, "w", encoding="utf-8") as stream:
                stream.write(render_trend(uri, trends))
        except OSError as exc:
            raise UserError(f"cannot write the trend page {trend} ({exc}); pass another path") from exc
    return HistoryView(uri, corpus, trends, added, trend)


def add_audits(history: History, folders: tuple[str, ...], rules: SeriesRules) -> list[str]:
    """Add earlier audits' folders as nights, labelled by the UTC date each audit ran, oldest first; each
    is judged against the nights before it. Two audits of one date: the later one is kept."""
    audits: dict[str, tuple[str, AuditRecord]] = {}
    for folder in folders:
        record = _read_audit(folder)
        night = datetime.datetime.fromisoformat(record.created).astimezone(datetime.timezone.utc).date().isoformat()
        if night in audits:
            earlier = audits[night]
            logger.warning("%s and %s both audited %s: the later one is kept", earlier[0], folder, night)
            if earlier[1].created > record.created:
                continue
        audits[night] = (folder, record)
    added = []
    for night in sorted(audits):
        folder, record = audits[night]
        series = _judge_audit(history, night, folder, record, rules)
        added.append(f"{night}: {folder} ({series.verdict})")
    return added


def _read_audit(folder: str) -> AuditRecord:
    out = OutputDir(folder.removesuffix("/" + AUDIT_FILE))
    try:
        data = out.read_json(AUDIT_FILE)
    except (OSError, ValueError) as exc:
        raise UserError(f"{folder}: its {AUDIT_FILE} cannot be read ({exc})") from exc
    if data is None:
        raise UserError(f"{folder} holds no {AUDIT_FILE}: pass the folders `dscore audit` wrote")
    try:
        return AuditRecord.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{folder}/{AUDIT_FILE} is not an audit this dscore reads ({exc})") from exc


def _judge_audit(history: History, night: str, folder: str, record: AuditRecord, rules: SeriesRules) -> SeriesRecord:
    """One earlier audit as tonight: its per-row figures when it kept them, its canary's rows if any."""
    root = folder.removesuffix("/" + AUDIT_FILE)
    out = OutputDir(root)
    rows = None
    if record.row_stats and out.exists(out.path(ROW_STATS_FILE)):
        rows = pq.read_table(out.path(ROW_STATS_FILE), filesystem=out.fs)
    canary_dir = OutputDir(join(root, CANARY_DIR))
    canary = Canary.of_rows(canary_dir.read_rows()) if canary_dir.exists(canary_dir.path("_done")) else None
    bins = {OVERALL: record.histogram.overall, **record.histogram.partitions}
    tonight = Tonight(
        night,
        {OVERALL: record.overall, **record.partitions},
        {name: b.all_counts() for name, b in bins.items()},
        rows,
        scorer_identity(record.scorer_signature, None),
        None,
        canary,
    )
    thresholds = Thresholds(**record.config["thresholds"])
    series, table = judge_night(history, tonight, thresholds, rules)
    history.append(night, table)
    return series
