"""The series as pictures: `trend.html` (`dscore history`) and the small trend per scope in tonight's
`report.html`. Charts are inline SVG drawn here (no script, no network, no font files): the page opens
offline and stays small for hundreds of scopes. Every string from the data is HTML-escaped.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .nightly import SeriesRecord

__all__ = ["Point", "ScopeTrend", "line_chart", "render_trend", "series_section", "sparkline"]

_FLAG = "regression"
_CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1a202c; max-width: 1180px;
       margin: 24px auto; padding: 0 16px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 28px 0 6px;
border-bottom: 1px solid #e2e8f0; padding-bottom: 4px; }
.meta, .note { color: #4a5568; font-size: 13px; }
.charts { display: flex; gap: 10px; flex-wrap: wrap; }
.chart { border: 1px solid #e2e8f0; border-radius: 6px; padding: 4px 8px; }
.chart b { font-size: 12px; color: #4a5568; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 4px 8px; text-align: left; }
th { background: #f7fafc; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.flagged td { background: #fff5f5; }
"""


@dataclass(frozen=True)
class Point:
    """One night of one scope: its figures and what the rules said."""

    night: str
    segment: str
    pppl: float | None
    error_rate: float | None
    tail_share: float | None
    reference: float | None
    band: float | None
    status: str | None
    event: str | None = None


@dataclass
class ScopeTrend:
    """A scope's nights, in order."""

    name: str
    points: list[Point] = field(default_factory=list)

    @property
    def flagged(self) -> list[Point]:
        return [p for p in self.points if p.status == _FLAG]


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def line_chart(
    values: list[float | None],
    width: int = 340,
    height: int = 120,
    flagged: list[bool] | None = None,
    band: list[tuple[float, float] | None] | None = None,
    segments: list[int] = (),
    labels: tuple[str, str] = ("", ""),
) -> str:
    """An SVG line chart of `values` (None: a gap), with a shaded band per point, flagged points as red
    dots and dashed lines where a segment starts; `labels` name the first and last night."""
    pad = 6
    known = [v for v in values if v is not None and math.isfinite(v)]
    known += [b for pair in (band or []) if pair for b in pair if math.isfinite(b)]
    if not known:
        return (
            f"<svg width='{width}' height='{height}' role='img'><text x='8' y='20' font-size='11'>no data</text></svg>"
        )
    low, high = min(known), max(known)
    if high - low < 1e-12:
        low, high = low - 1, high + 1
    n = len(values)

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return height - 16 - (height - 24) * (v - low) / (high - low)

    parts = [f"<svg width='{width}' height='{height}' role='img' xmlns='http://www.w3.org/2000/svg'>"]
    if band:
        for i, pair in enumerate(band):
            if pair and all(math.isfinite(b) for b in pair):
                w = (width - 2 * pad) / max(n - 1, 1)
                parts.append(
                    f"<rect x='{x(i) - w / 2:.1f}' y='{y(pair[1]):.1f}' width='{w:.1f}' "
                    f"height='{max(y(pair[0]) - y(pair[1]), 0.5):.1f}' fill='#bee3f8' opacity='0.6'/>"
                )
    for i in segments:
        parts.append(
            f"<line x1='{x(i):.1f}' x2='{x(i):.1f}' y1='4' y2='{height - 14}' stroke='#805ad5' stroke-dasharray='4 3'/>"
        )
    run: list[str] = []
    for i, v in enumerate(values + [None]):
        if v is not None and math.isfinite(v):
            run.append(f"{x(i):.1f},{y(v):.1f}")
            continue
        if run:
            parts.append(f"<polyline points='{' '.join(run)}' fill='none' stroke='#2b6cb0' stroke-width='1.5'/>")
        run = []
    for i, v in enumerate(values):
        if flagged and flagged[i] and v is not None and math.isfinite(v):
            parts.append(
                f"<circle cx='{x(i):.1f}' cy='{y(v):.1f}' r='3.5' fill='#c53030'><title>flagged</title></circle>"
            )
    parts.append(
        f"<text x='{pad}' y='{height - 3}' font-size='10' fill='#4a5568'>{_e(labels[0])}</text>"
        f"<text x='{width - pad}' y='{height - 3}' font-size='10' fill='#4a5568' "
        f"text-anchor='end'>{_e(labels[1])}</text>"
        f"<text x='{pad}' y='11' font-size='10' fill='#4a5568'>{high:.4g}</text>"
        f"<text x='{pad}' y='{height - 17}' font-size='10' fill='#4a5568'>{low:.4g}</text></svg>"
    )
    return "".join(parts)


def sparkline(values: list[float | None], flagged: list[bool], width: int = 140, height: int = 44) -> str:
    """A small trend for a table cell: the line and its flagged nights."""
    return line_chart(values, width, height, flagged)


def _charts(trend: ScopeTrend) -> str:
    points = trend.points
    flagged = [p.status == _FLAG for p in points]
    starts = [i for i, p in enumerate(points) if i > 0 and p.segment != points[i - 1].segment]
    band = [
        (p.reference / (1 + p.band), p.reference * (1 + p.band)) if p.reference and p.band is not None else None
        for p in points
    ]
    labels = (points[0].night, points[-1].night) if points else ("", "")
    panels = [
        ("PPPL (shaded: the rolling reference's band)", [p.pppl for p in points], band),
        ("error rate", [p.error_rate for p in points], None),
        ("share of rows above the reference's 90th percentile", [p.tail_share for p in points], None),
    ]
    return (
        "<div class='charts'>"
        + "".join(
            f"<div class='chart'><b>{_e(title)}</b><br>"
            f"{line_chart(v, flagged=flagged, band=b, segments=starts, labels=labels)}</div>"
            for title, v, b in panels
        )
        + "</div>"
    )


def _events(trend: ScopeTrend) -> str:
    events = [f"{_e(p.night)}: {_e(p.event)}" for p in trend.points if p.event]
    flagged = [_e(p.night) for p in trend.flagged]
    lines = []
    if flagged:
        lines.append(f"flagged: {', '.join(flagged)}")
    if events:
        lines.append(f"events: {'; '.join(events)}")
    return f"<p class='note'>{' · '.join(lines)}</p>" if lines else ""


def render_trend(history: str, trends: list[ScopeTrend], shown: int = 24) -> str:
    """trend.html: the corpus and the `shown` scopes most often flagged (then the largest) charted, every
    scope in a table."""
    overall, *others = trends
    ranked = sorted(others, key=lambda t: (-len(t.flagged), -len(t.points), t.name))
    nights = len(overall.points)
    segments = len({p.segment for p in overall.points})
    body = [
        f"<h1>PPPL audit history</h1><p class='meta'>{_e(history)} · {nights} nights · {segments} segment(s) · "
        f"{len(trends)} scopes. Red dots: nights a rule flagged (rolling, drift or shape); dashed lines: a new "
        "segment (the scorer changed).</p>",
        f"<h2>{_e(overall.name)}</h2>",
        _charts(overall),
        _events(overall),
    ]
    for trend in ranked[:shown]:
        body += [f"<h2>{_e(trend.name)}</h2>", _charts(trend), _events(trend)]
    if len(ranked) > shown:
        body.append(f"<p class='note'>{len(ranked) - shown} more scopes in the table below.</p>")
    rows = "".join(
        f"<tr class='{'flagged' if t.flagged else ''}'><td>{_e(t.name)}</td><td class='num'>{len(t.points)}</td>"
        f"<td class='num'>{len(t.flagged)}</td><td class='num'>{_num(t.points[-1].pppl if t.points else None)}</td>"
        f"<td>{_e(t.points[-1].night if t.points else '')}</td></tr>"
        for t in [overall, *ranked]
    )
    body.append(
        "<h2>Every scope</h2><table><tr><th>scope</th><th>nights</th><th>flagged nights</th><th>last PPPL</th>"
        f"<th>last night</th></tr>{rows}</table>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>PPPL audit history</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def series_section(series: SeriesRecord) -> str:
    """report.html's section on tonight in its history: the verdict, the events, and per scope a small trend
    of its PPPL over the window (flagged nights red) beside each rule's verdict and reason."""
    head = (
        f"<h2>Against the history</h2><p class='meta'>{_e(series.history)} · night {_e(series.night)} · segment "
        f"from {_e(series.segment)} · verdict <b>{_e(series.verdict)}</b></p>"
    )
    notes = [f"<p class='note'>{_e(series.scorer_changed)}</p>"] if series.scorer_changed else []
    if series.events:
        notes.append(
            "<p class='note'>events: " + "; ".join(f"{_e(e['scope'])} {_e(e['event'])}" for e in series.events) + "</p>"
        )
    rows = []
    for scope in series.scopes:
        values = [point[1] for point in scope.recent]
        flagged = [point[2] == _FLAG for point in scope.recent]
        cells = "".join(f"<td><b>{_e(rule.status)}</b><br>{_e(rule.reason)}</td>" for _, rule in scope.rules())
        css = "flagged" if scope.flagged else ""
        rows.append(f"<tr class='{css}'><td>{_e(scope.name)}</td><td>{sparkline(values, flagged)}</td>{cells}</tr>")
    table = (
        "<table><tr><th>scope</th><th>PPPL, recent nights</th><th>rolling</th><th>drift</th><th>shape</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    return head + "".join(notes) + table
