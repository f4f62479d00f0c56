"""The audit's `report.html`: one self-contained page to look at, rendered from an audit.json record.

The verdict comes first, then PPPL per partition against the baseline, the per-sentence PPPL
histogram, the positionwise cross-entropy curves and the worst sentences. Plots are drawn with
matplotlib's Agg canvas (no pyplot, no display, no global state) and embedded as base64 PNG, so the
file opens offline and can be mailed or archived as is. Every string from the data is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass

from ...io import schema as S
from .baseline import IMPROVEMENT, INSUFFICIENT, NEW, NO_CHANGE, OVERALL, REGRESSION, VANISHED, Check, Comparison
from .records import AuditRecord, Cutoff, Histogram, Listed, Outliers, Positionwise, ScopeFigures

__all__ = ["render_report"]

MAX_BARS = 40  # partitions drawn in the bar chart (regressed and most changed first); the table has all
MAX_CURVES = 4  # sentence lengths drawn in the Figure-4 panel (the most frequent ones)
MIN_POSITION_TOKENS = 20  # positions with fewer tokens are too noisy to draw
_TEXT_CHARS = 300  # text shown per listed sentence

_LABELS = {"pppl_token": "PPPL per token", "pppl_word": "PPPL per word"}
_BLUE, _GREY, _RED = "#2b6cb0", "#a0aec0", "#c53030"
_GREEN, _AMBER = "#2f855a", "#b7791f"
_VERDICT_COLOURS = {REGRESSION: _RED, INSUFFICIENT: _AMBER, IMPROVEMENT: _GREEN, NO_CHANGE: _BLUE}
_CSS_CLASS = {REGRESSION: "regressed", INSUFFICIENT: "insufficient", IMPROVEMENT: "improved"}

_CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1a202c;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid #e2e8f0; padding-bottom: 4px; }
.meta, .note { color: #4a5568; font-size: 13px; }
.verdict { padding: 14px 18px; border-radius: 6px; color: #fff; margin: 16px 0; }
.verdict h2 { border: 0; margin: 0; padding: 0; font-size: 22px; }
.verdict ul { margin: 8px 0 0 0; padding-left: 20px; }
.pass { background: #2f855a; } .regression { background: #c53030; }
.incomparable { background: #b7791f; } .none { background: #4a5568; }
.insufficient-data { background: #b7791f; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.card { border: 1px solid #e2e8f0; border-radius: 6px; padding: 10px 14px; min-width: 140px; }
.card b { display: block; font-size: 22px; } .card span { color: #4a5568; font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #f7fafc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; overflow-wrap: anywhere;
          min-width: 360px; max-width: 560px; }
tr.overall td { font-weight: bold; background: #f7fafc; }
tr.regressed td { background: #fff5f5; } tr.insufficient td { background: #fffaf0; }
tr.improved td { background: #f0fff4; }
img { max-width: 100%; display: block; margin: 8px 0; }
"""


def render_report(audit: AuditRecord, baseline: AuditRecord | None = None) -> str:
    """The report page for an audit; `baseline` (the previous audit) adds its histogram."""
    from matplotlib import rc_context

    with rc_context({"text.parse_math": False}):  # partition names are data: "$x$" is not mathtext
        return _render(audit, baseline)


def _render(audit: AuditRecord, baseline: AuditRecord | None) -> str:
    comparison = audit.baseline
    body = [
        f"<h1>PPPL audit</h1><p class='meta'>{_meta(audit)}</p>",
        _estimate(audit.estimate),
        _verdict(comparison),
        _cards(audit),
        *_changes(comparison),
        "<h2>Pseudo-perplexity per partition</h2>",
        _img(_partition_chart(audit, comparison), "PPPL per partition against the baseline"),
        _partition_table(audit, comparison),
        "<h2>Per-sentence pseudo-perplexity</h2>",
        _img(_histogram_chart(audit, baseline), "histogram of per-sentence PPPL"),
        _histogram_note(audit.histogram),
        "<h2>Positionwise cross-entropy</h2>",
        _positionwise(audit.positionwise),
        "<h2>Worst sentences</h2>",
        _outlier_table(audit.outliers),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>PPPL audit</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>"
    )


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None, digits: int = 4) -> str:
    """4 significant digits, but whole numbers from 10,000 on (no exponents in a table)."""
    if value is None:
        return "–"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.{digits}g}"


def _pct(value: float | None, signed: bool = False) -> str:
    return "–" if value is None else f"{value:{'+' if signed else ''}.2%}"


def _meta(audit: AuditRecord) -> str:
    scorers = audit.signature if isinstance(audit.signature, list) else [audit.signature]
    who = "; ".join(f"{s[S.MODEL]} ({s[S.VARIANT]})" for s in scorers)
    return _e(f"{audit.rows_dir} · scored by {who} · audited {audit.created}")


def _estimate(estimate: dict | None) -> str:
    """For rows a maskless student scored: that every figure is its estimate, and how far it is from its teacher."""
    if estimate is None:
        return ""
    heldout = estimate.get("heldout") or {}
    error = (f"held-out agreement with the teacher: Pearson {_num(heldout.get('pearson'))}, RMSE "
             f"{_num(heldout.get('rmse'))} nats per sentence on {heldout.get('rows')} rows" if heldout else
             "no held-out figures recorded")
    return (f"<div class='verdict none'><h2>Estimate: scored by a maskless student ({_e(str(estimate.get('target')))}), "
            f"not by the PLL</h2><ul><li>student {_e(str(estimate.get('student')))} of teacher "
            f"{_e(str(estimate.get('teacher')))}; {_e(error)}</li><li>{_e(str(estimate.get('out_of_range')))} rows "
            f"predicted outside the student's training range</li><li>{_e(estimate['note'])}</li></ul></div>")


def _verdict(comparison: Comparison | None) -> str:
    """The banner: what the nightly job returns, and why."""
    if comparison is None:
        return "<div class='verdict none'><h2>No baseline: figures only (exit 0)</h2></div>"
    verdict, code = comparison.verdict, comparison.exit_code
    title = {
        "pass": f"PASS: no scope changed beyond the tolerance, with {_confidence(comparison)} confidence (exit {code})",
        "regression": f"REGRESSION in {len(comparison.regressions)} place(s) (exit {code})",
        INSUFFICIENT: f"INSUFFICIENT DATA in {len(comparison.insufficient)} place(s): the data cannot tell (exit {code})",
        "incomparable": f"INCOMPARABLE: baseline scored by another model or variant (exit {code})",
    }[verdict]
    items = [
        f"<li><b>{_e(c.name)}</b> ({_e(c.status)}): {_e('; '.join(c.reasons))}</li>"
        for c in [*comparison.regressions, *comparison.insufficient]
    ]
    if comparison.signature_mismatch:
        items.append(f"<li>{_e(comparison.signature_mismatch)}</li>")
    for label, names in (("new partitions", comparison.new_partitions),
                         ("vanished partitions", comparison.vanished_partitions)):
        if names:
            items.append(f"<li>{label} (not judged): {_e(', '.join(names))}</li>")
    items.append(f"<li>baseline: {_e(comparison.source)}</li>")
    css = verdict.replace(" ", "-")
    return f"<div class='verdict {css}'><h2>{_e(title)}</h2><ul>{''.join(items)}</ul></div>"


def _confidence(comparison: Comparison) -> str:
    return f"{comparison.thresholds.confidence:.0%}"


def _changes(comparison: Comparison | None) -> list[str]:
    """Per scope: the PPPL ratio with its interval against the no-change band, and the verdict table."""
    if comparison is None:
        return []
    t = comparison.thresholds
    note = (
        f"<p class='note'>Ratio of {_e(t.metric)} this run / baseline, with its {_confidence(comparison)} "
        f"interval. Inside the shaded band [1/(1+{t.max_pppl_increase:g}), 1+{t.max_pppl_increase:g}] a change "
        "counts as none; an interval that crosses a band edge cannot tell (insufficient data). Methods: "
        f"{_e('; '.join(comparison.methods))}. Seed {t.seed}.</p>"
    )
    return ["<h2>Changes against the baseline</h2>", note, _img(_ratio_chart(comparison), "PPPL ratio per scope"),
            _verdict_table(comparison)]


def _scopes(comparison: Comparison) -> list[Check]:
    return [comparison.overall, *sorted(comparison.partitions, key=lambda c: c.name)]


def _ratio_chart(comparison: Comparison) -> bytes:
    """One line per scope: the ratio and its interval, coloured by verdict, against the no-change band."""
    scopes = [c for c in _scopes(comparison) if c.status not in (NEW, VANISHED)][:MAX_BARS]
    fig, ax = _figure(10, 1.4 + 0.42 * max(len(scopes), 2))
    tol = comparison.thresholds.max_pppl_increase
    ax.axvspan(1 / (1 + tol), 1 + tol, color="#e2e8f0", label="no-change band")
    ax.axvline(1.0, color="#4a5568", linewidth=0.8)
    y = list(range(len(scopes)))[::-1]
    drawn = False
    for i, c in zip(y, scopes):
        colour = _VERDICT_COLOURS.get(c.status, _GREY)
        if c.pppl_ratio is None:
            ax.text(1.0, i, "  no interval: " + (c.reasons[0] if c.reasons else "not judged"), va="center",
                    fontsize=8, color=colour)
            continue
        drawn = True
        ratio, low, high = c.pppl_ratio, c.pppl_ratio_low, c.pppl_ratio_high
        ax.errorbar(ratio, i, xerr=[[max(ratio - low, 0.0)], [max(high - ratio, 0.0)]], fmt="o",
                    color=colour, capsize=4)
        ax.text(high, i, f"  {ratio:.3f} [{low:.3f}, {high:.3f}] {c.status}", va="center", fontsize=8)
    if not drawn:
        ax.set_xlim(0.8, 1.25)
    ax.set_yticks(y, [_short(c.name, 28) for c in scopes])
    ax.set_xlabel("PPPL ratio this run / baseline")
    ax.margins(x=0.35)
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def _verdict_table(comparison: Comparison) -> str:
    head = ("<tr><th>scope</th><th>rows (baseline → now)</th><th>baseline PPPL</th><th>PPPL</th><th>ratio</th>"
            "<th>interval</th><th>error-rate change (points)</th><th>paired</th><th>verdict</th><th>why</th></tr>")
    return f"<table>{head}{''.join(_verdict_row(c) for c in _scopes(comparison))}</table>"


def _verdict_row(c: Check) -> str:
    ratio = "–" if c.pppl_ratio is None else f"{c.pppl_ratio:.4f}"
    interval = "–" if c.pppl_ratio is None else f"{c.pppl_ratio_low:.4f} – {c.pppl_ratio_high:.4f}"
    error = "–" if c.error_rate_change is None else (
        f"{c.error_rate_change * 100:+.2f} [{c.error_rate_change_low * 100:+.2f}, "
        f"{c.error_rate_change_high * 100:+.2f}]")
    return (
        f"<tr class='{_CSS_CLASS.get(c.status, '')}'><td>{_e(c.name)}</td>"
        f"<td class='num'>{_e(c.baseline_rows if c.baseline_rows is not None else '–')} → "
        f"{_e(c.rows if c.rows is not None else '–')}</td><td class='num'>{_num(c.baseline_pppl)}</td>"
        f"<td class='num'>{_num(c.pppl)}</td><td class='num'>{ratio}</td><td class='num'>{interval}</td>"
        f"<td class='num'>{error}</td><td>{'yes' if c.paired else 'no'}</td><td><b>{_e(c.status)}</b></td>"
        f"<td>{_e('; '.join(c.reasons))}</td></tr>"
    )


def _cards(audit: AuditRecord) -> str:
    overall, outliers = audit.overall, audit.outliers
    cards = [
        (f"{overall.rows:,}", "sentences"),
        (_pct(overall.error_rate), f"error rate ({overall.errors:,} rows)"),
        (_num(overall.pppl_token), "PPPL per token"),
        (_num(overall.pppl_word), "PPPL per word"),
        (f"{outliers.count:,}", f"outliers (k = {outliers.rule.k:g})"),
        (f"{len(audit.partitions)}", "partitions"),
    ]
    boxes = "".join(f"<div class='card'><b>{_e(value)}</b><span>{_e(label)}</span></div>" for value, label in cards)
    return f"<div class='cards'>{boxes}</div>"


@dataclass(frozen=True)
class _Row:
    """One scope of the partition chart and table: this run's figures and its check against the baseline."""

    name: str
    figures: ScopeFigures | None
    pppl: float | None
    baseline: float | None
    change: float | None
    status: str
    reasons: tuple[str, ...]


def _partition_rows(audit: AuditRecord, comparison: Comparison | None) -> list[_Row]:
    """One row per partition of this run or the baseline: figures, baseline, change, status."""
    checks = {c.name: c for c in comparison.partitions} if comparison else {}
    names = sorted(set(audit.partitions) | set(checks))
    return [_row(name, audit.partitions.get(name), checks.get(name), audit.metric) for name in names]


def _row(name: str, figures: ScopeFigures | None, check: Check | None, metric: str) -> _Row:
    return _Row(
        name, figures, figures.figure(metric) if figures else None,
        check.baseline_pppl if check else None, check.pppl_change if check else None,
        check.status if check else "–", check.reasons if check else (),
    )


def _partition_chart(audit: AuditRecord, comparison: Comparison | None) -> bytes:
    """Horizontal grouped bars, baseline (grey) and this run (blue, red when regressed), change annotated."""
    rows = _partition_rows(audit, comparison)
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


def _bar_label(row: _Row, compared: bool) -> str:
    """' 12.3 (+4.1%)' against the baseline, ' 12.3  [new]' without one, ' 12.3' with no baseline at all."""
    if row.change is not None:
        return f" {row.pppl:.3g} ({row.change:+.1%})"
    return f" {row.pppl:.3g}" + (f"  [{row.status}]" if compared else "")


def _partition_table(audit: AuditRecord, comparison: Comparison | None) -> str:
    """Every partition's figures; baseline, change and status columns only when there is a baseline."""
    rows = _partition_rows(audit, comparison)
    overall = _row(OVERALL, audit.overall, comparison.overall if comparison else None, audit.metric)
    columns = ["partition", "rows", "errors", "error rate", "PPPL token", "PPPL word", "outliers"]
    columns += ["baseline", "change", "status"] if comparison else []
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    body = [_table_row(overall, "overall", comparison is not None)]
    body += [_table_row(r, _CSS_CLASS.get(r.status, ""), comparison is not None) for r in rows]
    more = "" if len(rows) <= MAX_BARS else (
        f"<p class='note'>The chart shows {MAX_BARS} of {len(rows)} partitions: regressed and most changed first.</p>"
    )
    return f"{more}<table>{head}{''.join(body)}</table>"


def _table_row(r: _Row, css: str, compared: bool) -> str:
    f = r.figures
    cells = [f"<td>{_e(r.name)}</td>", *(_figure_cells(f) if f else ["<td class='num'>–</td>"] * 6)]
    if compared:
        cells += [
            f"<td class='num'>{_num(r.baseline)}</td>", f"<td class='num'>{_pct(r.change, signed=True)}</td>",
            f"<td title='{_e('; '.join(r.reasons))}'>{_e(r.status)}</td>",
        ]
    return f"<tr class='{_e(css)}'>{''.join(cells)}</tr>"


def _figure_cells(f: ScopeFigures) -> list[str]:
    return [
        _td(f.rows), _td(f.errors), f"<td class='num'>{_pct(f.error_rate)}</td>",
        f"<td class='num'>{_num(f.pppl_token)}</td>", f"<td class='num'>{_num(f.pppl_word)}</td>", _td(f.outliers),
    ]


def _td(value: int | None) -> str:
    return f"<td class='num'>{'–' if value is None else f'{value:,}'}</td>"


def _histogram_chart(audit: AuditRecord, baseline: AuditRecord | None) -> bytes:
    """Share of sentences per log-spaced PPPL bin, this run against the baseline's, with the outlier cutoff."""
    edges, counts = audit.histogram.edges, audit.histogram.overall.counts
    fig, ax = _figure(10, 4.2)
    ax.stairs(_shares(counts), edges, fill=True, color=_BLUE, alpha=0.55, label="this run")
    base = baseline.histogram.overall.counts if baseline and baseline.histogram.edges == edges else None
    if base:
        ax.stairs(_shares(base), edges, color="#1a202c", linewidth=1.5, label="baseline")
    cutoff = audit.outliers.cutoffs.get(OVERALL)
    if cutoff and cutoff.high_pppl and edges[0] <= cutoff.high_pppl <= edges[-1]:
        ax.axvline(cutoff.high_pppl, color=_RED, linestyle="--", linewidth=1.2,
                   label=f"outlier cutoff ({cutoff.high_pppl:.3g})")
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


def _histogram_note(histogram: Histogram) -> str:
    overall, edges = histogram.overall, histogram.edges
    return (
        f"<p class='note'>{sum(overall.counts):,} scored sentences in {len(edges) - 1} bins from {edges[0]:g} "
        f"to {edges[-1]:g}; {overall.underflow:,} below, {overall.overflow:,} above.</p>"
    )


def _positionwise(curves: Positionwise | None) -> str:
    if curves is None:
        return "<p class='note'>No per-token log-probabilities in the rows: score with --per-token to get them.</p>"
    note = (
        "<p class='note'>-log p(w<sub>t</sub> | W<sub>\\t</sub>), natural log, at position t among the scored tokens. "
        "Left: every sentence long enough to have position t. Right: sentences of one exact length, as in "
        "Salazar et al. (2020), Figure 4, where a flat curve is expected; spikes point at systematic problems.</p>"
    )
    return note + _img(_positionwise_chart(curves), "positionwise cross-entropy")


def lengths_title(shown: int, lengths: int) -> str:
    """The title of the by-length panel, which draws the `shown` most frequent of `lengths` lengths."""
    if lengths == 0:
        return "by sentence length"
    if lengths == 1:
        return "by sentence length (its only length)"
    if shown == lengths:
        return f"by sentence length (all {lengths} lengths)"
    return f"by sentence length (the {shown} most frequent of {lengths:,} lengths)"


def _positionwise_chart(curves: Positionwise) -> bytes:
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
        right.plot(range(1, len(means) + 1), means, marker="o", markersize=3, linewidth=1.2,
                   label=f"|W| = {length} ({curve.sentences:,} sentences)")
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


def _floored(cutoff: Cutoff) -> bool:
    """Whether the cutoff's sigma is the rule's floor rather than the spread measured."""
    return cutoff.measured_sigma is not None and cutoff.measured_sigma < cutoff.sigma


def _outlier_table(outliers: Outliers) -> str:
    rule = outliers.rule
    tails = "both tails" if rule.low_tail else "high tail"
    cutoffs = "; ".join(
        f"{name}: median {c.median:.3f}, sigma {c.sigma:.3f}"
        + (f" (the floor: {c.measured_sigma:.4f} measured)" if _floored(c) else "")
        + f", above {c.high:.3f}" + (f" or below {c.low:.3f}" if c.low is not None else "")
        for name, c in list(outliers.cutoffs.items())[:5]
    )
    floor = f", sigma at least {rule.min_sigma:g} nats per token" if rule.min_sigma else ""
    intro = (
        f"<p class='note'>{outliers.count:,} of {outliers.eligible:,} sentences flagged: NLL per token beyond "
        f"median ± {rule.k:g} · 1.4826 · MAD ({tails}, scope {_e(rule.scope)}, "
        f"at least {rule.min_tokens} tokens{floor}). {_e(cutoffs)}. All flagged rows are in {_e(outliers.file)}; "
        f"the {len(outliers.listed)} most extreme are listed.</p>"
    )
    if not outliers.listed:
        return intro
    head = "<tr><th>#</th><th>id</th><th>partition</th><th>NLL/token</th><th>PPPL</th><th>z</th><th>tokens</th>" \
           "<th>hardest token (t, nats)</th><th>text</th></tr>"
    body = [_outlier_row(rank, row) for rank, row in enumerate(outliers.listed, 1)]
    return f"{intro}<table>{head}{''.join(body)}</table>"


def _outlier_row(rank: int, row: Listed) -> str:
    text = row.text[:_TEXT_CHARS] + ("…" if row.text_truncated or len(row.text) > _TEXT_CHARS else "")
    worst = "–" if row.worst_token is None else f"{row.worst_token} (t={row.worst_position}, {row.worst_token_nll:.2f})"
    return (
        f"<tr><td class='num'>{rank}</td><td>{_e(row.id)}</td><td>{_e(row.partition)}</td>"
        f"<td class='num'>{row.nll_per_token:.3f}</td><td class='num'>{_num(row.pppl_token)}</td>"
        f"<td class='num'>{row.robust_z:+.1f}</td><td class='num'>{row.n_tokens}</td>"
        f"<td>{_e(worst)}</td><td class='text'>{_e(text)}</td></tr>"
    )


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


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
