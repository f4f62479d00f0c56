"""The charts of the audit's report.html, drawn with matplotlib's Agg canvas (no pyplot, no display, no
global state) and returned as PNG bytes for `report.py` to embed; and the scope rows that the partition
chart and the partition table share.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from .records import AuditRecord, Positionwise, ScopeFigures
from .verdicts import IMPROVEMENT, INSUFFICIENT, NEW, NO_CHANGE, OVERALL, REGRESSION, VANISHED, Check, Comparison

MAX_BARS = 40  # partitions drawn in the bar chart (regressed and most changed first); the table has all
MAX_CURVES = 4  # sentence lengths drawn in the Figure-4 panel (the most frequent ones)
MIN_POSITION_TOKENS = 20  # positions with fewer tokens are too noisy to draw

_LABELS = {"pppl_token": "PPPL per token", "pppl_word": "PPPL per word"}
_BLUE, _GREY, _RED = "#2b6cb0", "#a0aec0", "#c53030"
_GREEN, _AMBER = "#2f855a", "#b7791f"
_VERDICT_COLOURS = {REGRESSION: _RED, INSUFFICIENT: _AMBER, IMPROVEMENT: _GREEN, NO_CHANGE: _BLUE}


def scope_checks(comparison: Comparison) -> list[Check]:
    """The corpus's check, then each partition's by name: the order of the ratio chart and the verdict table."""
    return [comparison.overall, *sorted(comparison.partitions, key=lambda c: c.name)]


def ratio_chart(comparison: Comparison) -> bytes:
    """One line per scope: the ratio and its interval, coloured by verdict, against the no-change band."""
    scopes = [c for c in scope_checks(comparison) if c.status not in (NEW, VANISHED)][:MAX_BARS]
    fig, ax = _figure(10, 1.4 + 0.42 * max(len(scopes), 2))
    tol = comparison.thresholds.max_pppl_increase
    ax.axvspan(1 / (1 + tol), 1 + tol, color="#e2e8f0", label="no-change band")
    ax.axvline(1.0, color="#4a5568", linewidth=0.8)
    y = list(range(len(scopes)))[::-1]
    drawn = False
    for i, c in zip(y, scopes):
        colour = _VERDICT_COLOURS.get(c.status, _GREY)
        if c.pppl_ratio is None:
            ax.text(
                1.0,
                i,
                "  no interval: " + (c.reasons[0] if c.reasons else "not judged"),
                va="center",
                fontsize=8,
                color=colour,
            )
            continue
        drawn = True
        ratio, low, high = c.pppl_ratio, c.pppl_ratio_low, c.pppl_ratio_high
        ax.errorbar(
            ratio, i, xerr=[[max(ratio - low, 0.0)], [max(high - ratio, 0.0)]], fmt="o", color=colour, capsize=4
        )
        ax.text(high, i, f"  {ratio:.3f} [{low:.3f}, {high:.3f}] {c.status}", va="center", fontsize=8)
    if not drawn:
        ax.set_xlim(0.8, 1.25)
    ax.set_yticks(y, [_short(c.name, 28) for c in scopes])
    ax.set_xlabel("PPPL ratio this run / baseline")
    ax.margins(x=0.35)
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


@dataclass(frozen=True)
class Row:
    """One scope of the partition chart and table: this run's figures and its check against the baseline."""

    name: str
    figures: ScopeFigures | None
    pppl: float | None
    baseline: float | None
    change: float | None
    status: str
    reasons: tuple[str, ...]


def partition_rows(audit: AuditRecord, comparison: Comparison | None) -> list[Row]:
    """One row per partition of this run or the baseline: figures, baseline, change, status."""
    checks = {c.name: c for c in comparison.partitions} if comparison else {}
    names = sorted(set(audit.partitions) | set(checks))
    return [scope_row(name, audit.partitions.get(name), checks.get(name), audit.metric) for name in names]


def scope_row(name: str, figures: ScopeFigures | None, check: Check | None, metric: str) -> Row:
    """One scope's row from this run's figures and its check (None where either is missing)."""
    return Row(
        name,
        figures,
        figures.figure(metric) if figures else None,
        check.baseline_pppl if check else None,
        check.pppl_change if check else None,
        check.status if check else "–",
        check.reasons if check else (),
    )


def partition_chart(audit: AuditRecord, comparison: Comparison | None) -> bytes:
    """Horizontal grouped bars, baseline (grey) and this run (blue, red when regressed), change annotated."""
    rows = partition_rows(audit, comparison)
    rows.sort(key=lambda r: (r.status != REGRESSION, -abs(r.change or 0.0), r.name))
    rows = sorted(rows[:MAX_BARS], key=lambda r: r.name, reverse=True)  # top to bottom alphabetical
    fig, ax = _figure(10, 1.2 + 0.42 * max(len(rows), 2))
    y = list(range(len(rows)))
    height = 0.38 if comparison else 0.6
    if comparison:
        ax.barh([i + height / 2 for i in y], [r.baseline or 0 for r in rows], height, color=_GREY, label="baseline")
    colours = [_RED if r.status == REGRESSION else _BLUE for r in rows]
    shift = -height / 2 if comparison else 0
    ax.barh([i + shift for i in y], [r.pppl or 0 for r in rows], height, color=colours, label="this run")
    values = [v for r in rows for v in (r.pppl, r.baseline) if v]
    if values and max(values) / min(values) > 30:
        _log_x(ax)
    for i, r in zip(y, rows):
        if r.pppl is not None:
            ax.text(r.pppl, i + shift, _bar_label(r, comparison is not None), va="center", fontsize=9)
    ax.set_yticks(y, [_short(r.name, 28) for r in rows])
    ax.set_xlabel(f"{_LABELS[audit.metric]} (corpus level)")
    ax.margins(x=0.18)
    if comparison:
        fig.legend(loc="outside upper right", ncols=2, fontsize=9)
    return _png(fig)


def _bar_label(row: Row, compared: bool) -> str:
    """' 12.3 (+4.1%)' against the baseline, ' 12.3  [new]' without one, ' 12.3' with no baseline at all."""
    if row.change is not None:
        return f" {row.pppl:.3g} ({row.change:+.1%})"
    return f" {row.pppl:.3g}" + (f"  [{row.status}]" if compared else "")


def histogram_chart(audit: AuditRecord, baseline: AuditRecord | None) -> bytes:
    """Share of sentences per log-spaced PPPL bin, this run against the baseline's, with the outlier cutoff."""
    edges, counts = audit.histogram.edges, audit.histogram.overall.counts
    fig, ax = _figure(10, 4.2)
    ax.stairs(_shares(counts), edges, fill=True, color=_BLUE, alpha=0.55, label="this run")
    base = baseline.histogram.overall.counts if baseline and baseline.histogram.edges == edges else None
    if base:
        ax.stairs(_shares(base), edges, color="#1a202c", linewidth=1.5, label="baseline")
    cutoff = audit.outliers.cutoffs.get(OVERALL)
    if cutoff and cutoff.high_pppl and edges[0] <= cutoff.high_pppl <= edges[-1]:
        ax.axvline(
            cutoff.high_pppl,
            color=_RED,
            linestyle="--",
            linewidth=1.2,
            label=f"outlier cutoff ({cutoff.high_pppl:.3g})",
        )
    _log_x(ax)
    ax.set_xlim(*_occupied_range(edges, counts, base))
    ax.set_xlabel("per-sentence PPPL per token (log scale)")
    ax.set_ylabel("share of sentences")
    ax.legend(fontsize=9)
    return _png(fig)


def _shares(counts: list[int]) -> list[float]:
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def _occupied_range(edges: list[float], counts: list[int], other: list[int] | None) -> tuple[float, float]:
    """The x range holding every non-empty bin (of both histograms), one bin of margin each side."""
    filled = [i for i, c in enumerate(counts) if c] + [i for i, c in enumerate(other or []) if c]
    if not filled:
        return edges[0], edges[-1]
    return edges[max(min(filled) - 1, 0)], edges[min(max(filled) + 2, len(edges) - 1)]


def lengths_title(shown: int, lengths: int) -> str:
    """The title of the by-length panel, which draws the `shown` most frequent of `lengths` lengths."""
    if lengths == 0:
        return "by sentence length"
    if lengths == 1:
        return "by sentence length (its only length)"
    if shown == lengths:
        return f"by sentence length (all {lengths} lengths)"
    return f"by sentence length (the {shown} most frequent of {lengths:,} lengths)"


def positionwise_chart(curves: Positionwise) -> bytes:
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = _figure(11, 4.2, panels=2)
    means, tokens = curves.by_position.mean_nll, curves.by_position.tokens
    shown = [(t, mean) for t, (mean, n) in enumerate(zip(means, tokens), 1) if n >= MIN_POSITION_TOKENS]
    if shown:
        left.plot(*zip(*shown), color=_BLUE, linewidth=1.5)
    else:
        _empty(left, f"no position has {MIN_POSITION_TOKENS} or more scored tokens:\ntoo few sentences to draw a curve")
    left.set_title(f"by absolute position (positions with ≥ {MIN_POSITION_TOKENS} tokens)", fontsize=10)
    frequent = sorted(curves.by_length.items(), key=lambda kv: (-kv[1].sentences, int(kv[0])))[:MAX_CURVES]
    for length, curve in sorted(frequent, key=lambda kv: int(kv[0])):
        means = [s / curve.sentences for s in curve.sum_nll]
        right.plot(
            range(1, len(means) + 1),
            means,
            marker="o",
            markersize=3,
            linewidth=1.2,
            label=f"|W| = {length} ({curve.sentences:,} sentences)",
        )
    right.set_title(lengths_title(len(frequent), len(curves.by_length)), fontsize=10)
    if frequent:
        right.legend(fontsize=8)
    else:
        _empty(right, "no sentence length within the audit's max_length")
    for ax in (left, right):
        ax.set_ylim(0, max(ax.dataLim.y1, 0.1) * 1.1)  # spikes read against the whole cross-entropy, not noise
        ax.set_xlabel("position t")
        ax.set_ylabel("mean cross-entropy (nats)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return _png(fig)


def _empty(ax, why: str) -> None:
    """A panel with nothing to draw says why, instead of showing an empty frame."""
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#4a5568")
    ax.set_xlim(0, 1)


def _log_x(ax) -> None:
    """A log x axis labelled 1, 2, 5, 10, 20, 50, ... in plain numbers rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.xaxis.set_minor_formatter(plain)


def _short(name: str, chars: int) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "…"


def _figure(width: float, height: float, panels: int = 1):
    """A figure on the Agg canvas, independent of pyplot and of any interactive backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels)
    return fig, axes


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()
