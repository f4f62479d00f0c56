"""The audit's `report.html`: one self-contained page to look at, rendered from an audit.json record.

The verdict comes first (its banner lists the scopes that gave it; scopes whose data cannot tell, under
another verdict, sit apart in a neutral box), then PPPL per partition against the baseline, the
per-sentence PPPL histogram, the positionwise cross-entropy curves, the rows made mostly of unknown tokens
(a list of their own: their PLL measures the tokenizer, not the text) and the worst rows, both overall and
per partition whatever the outlier rule's scope, flagged or not, each labelled. The plots (`charts.py`) are
embedded as base64 PNG, so the file opens offline and can be mailed or archived as is. Every string from the
data is HTML-escaped.
"""

from __future__ import annotations

import base64
import html

from ...io import schema as S
from .charts import (
    MAX_BARS,
    Row,
    histogram_chart,
    partition_chart,
    partition_rows,
    positionwise_chart,
    ratio_chart,
    scope_checks,
    scope_row,
)
from .outliers import BASELINE, SERIES
from .records import (
    AuditRecord,
    Cutoff,
    Histogram,
    Listed,
    OutlierRuleRecord,
    Outliers,
    Positionwise,
    ScopeFigures,
    UnknownTokens,
    WorstRows,
)
from .trend import series_section
from .verdicts import IMPROVEMENT, INSUFFICIENT, OVERALL, REGRESSION, Check, Comparison

__all__ = ["render_report"]

_TEXT_CHARS = 300  # text shown per listed sentence

_CSS_CLASS = {REGRESSION: "regressed", INSUFFICIENT: "insufficient", IMPROVEMENT: "improved"}
_WORST = {  # scope -> the title of its list of worst rows, and what its z is measured against
    "overall": ("Worst rows overall", "the whole corpus"),
    "partition": ("Worst rows per partition", "the row's own partition"),
}

_CSS = """
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1a202c;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid #e2e8f0; padding-bottom: 4px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
.meta, .note { color: #4a5568; font-size: 13px; }
.verdict { padding: 14px 18px; border-radius: 6px; color: #fff; margin: 16px 0; }
.verdict h2 { border: 0; margin: 0; padding: 0; font-size: 22px; }
.verdict ul { margin: 8px 0 0 0; padding-left: 20px; }
.pass { background: #2f855a; } .regression { background: #c53030; }
.incomparable { background: #b7791f; } .none { background: #4a5568; }
.insufficient-data { background: #b7791f; }
.aside { padding: 10px 18px; border: 1px solid #e2e8f0; border-left: 4px solid #a0aec0; border-radius: 6px;
         background: #f7fafc; margin: -8px 0 16px; font-size: 14px; }
.aside ul { margin: 6px 0 0 0; padding-left: 20px; }
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
tr.improved td { background: #f0fff4; } tr.flagged td { background: #fff5f5; }
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
        series_section(audit.series) if audit.series else "",
        "<h2>Pseudo-perplexity per partition</h2>",
        _img(partition_chart(audit, comparison), "PPPL per partition against the baseline"),
        _partition_table(audit, comparison),
        "<h2>Per-sentence pseudo-perplexity</h2>",
        _img(histogram_chart(audit, baseline), "histogram of per-sentence PPPL"),
        _histogram_note(audit.histogram),
        "<h2>Positionwise cross-entropy</h2>",
        _positionwise(audit.positionwise),
        *_unknown_rows(audit.unknown_tokens),
        "<h2>Worst rows</h2>",
        *_worst_rows(audit.outliers),
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
    error = (
        f"held-out agreement with the teacher: Pearson {_num(heldout.get('pearson'))}, RMSE "
        f"{_num(heldout.get('rmse'))} nats per sentence on {heldout.get('rows')} rows"
        if heldout
        else "no held-out figures recorded"
    )
    return (
        f"<div class='verdict none'><h2>Estimate: scored by a maskless student ({_e(str(estimate.get('target')))}), "
        f"not by the PLL</h2><ul><li>student {_e(str(estimate.get('student')))} of teacher "
        f"{_e(str(estimate.get('teacher')))}; {_e(error)}</li><li>{_e(str(estimate.get('out_of_range')))} rows "
        f"predicted outside the student's training range</li><li>{_e(estimate['note'])}</li></ul></div>"
    )


def _verdict(comparison: Comparison | None) -> str:
    """The banner: what the nightly job returns, and why."""
    if comparison is None:
        return "<div class='verdict none'><h2>No baseline: figures only (exit 0)</h2></div>"
    verdict, code = comparison.verdict, comparison.exit_code
    title = {
        "pass": f"PASS: no scope changed beyond the tolerance, with {_confidence(comparison)} confidence (exit {code})",
        "regression": f"REGRESSION in {len(comparison.regressions)} place(s) (exit {code})",
        INSUFFICIENT: (
            f"INSUFFICIENT DATA in {len(comparison.insufficient)} place(s): the data cannot tell (exit {code})"
        ),
        "incomparable": f"INCOMPARABLE: baseline scored by another model or variant (exit {code})",
    }[verdict]
    items = [
        _scope_item(c)
        for c in {REGRESSION: comparison.regressions, INSUFFICIENT: comparison.insufficient}.get(verdict, ())
    ]
    if comparison.signature_mismatch:
        items.append(f"<li>{_e(comparison.signature_mismatch)}</li>")
    for label, names in (
        ("new partitions", comparison.new_partitions),
        ("vanished partitions", comparison.vanished_partitions),
    ):
        if names:
            items.append(f"<li>{label} (not judged): {_e(', '.join(names))}</li>")
    items.append(f"<li>baseline: {_e(comparison.source)}</li>")
    css = verdict.replace(" ", "-")
    return f"<div class='verdict {css}'><h2>{_e(title)}</h2><ul>{''.join(items)}</ul></div>{_undecided(comparison)}"


def _scope_item(c: Check) -> str:
    return f"<li><b>{_e(c.name)}</b> ({_e(c.status)}): {_e('; '.join(c.reasons))}</li>"


def _undecided(comparison: Comparison) -> str:
    """The scopes whose data cannot tell under another verdict (a regression elsewhere, or a pass that
    accepts them): listed apart from the banner, in a neutral box, since they are not what it says."""
    if comparison.verdict == INSUFFICIENT or not comparison.insufficient:
        return ""
    why = (
        "accepted by --accept-insufficient"
        if comparison.thresholds.accept_insufficient
        else "not a regression; alone they would end the run with exit 5"
    )
    items = "".join(_scope_item(c) for c in comparison.insufficient)
    return (
        f"<div class='aside'><b>Insufficient data in {len(comparison.insufficient)} place(s): the data cannot tell "
        f"({_e(why)})</b><ul>{items}</ul></div>"
    )


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
    return [
        "<h2>Changes against the baseline</h2>",
        note,
        _img(ratio_chart(comparison), "PPPL ratio per scope"),
        _verdict_table(comparison),
    ]


def _verdict_table(comparison: Comparison) -> str:
    head = (
        "<tr><th>scope</th><th>rows (baseline → now)</th><th>baseline PPPL</th><th>PPPL</th><th>ratio</th>"
        "<th>interval</th><th>error-rate change (points)</th><th>paired</th><th>verdict</th><th>why</th></tr>"
    )
    return f"<table>{head}{''.join(_verdict_row(c) for c in scope_checks(comparison))}</table>"


def _verdict_row(c: Check) -> str:
    ratio = "–" if c.pppl_ratio is None else f"{c.pppl_ratio:.4f}"
    interval = "–" if c.pppl_ratio is None else f"{c.pppl_ratio_low:.4f} – {c.pppl_ratio_high:.4f}"
    error = (
        "–"
        if c.error_rate_change is None
        else (
            f"{c.error_rate_change * 100:+.2f} [{c.error_rate_change_low * 100:+.2f}, "
            f"{c.error_rate_change_high * 100:+.2f}]"
        )
    )
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
        (_pct(overall.error_rate), f"error rate ({_rows(overall.errors)})"),
        (_num(overall.pppl_token), "PPPL per token"),
        (_num(overall.pppl_word), "PPPL per word"),
        (f"{outliers.count:,}", f"outliers (k = {outliers.rule.k:g}, scope {outliers.rule.scope})"),
        (f"{len(audit.partitions)}", "partitions"),
    ]
    if audit.unknown_tokens is not None:
        cards.insert(5, (f"{audit.unknown_tokens.count:,}", "rows mostly unknown tokens (listed apart)"))
    if audit.windowed_rows:  # documents longer than the model's window, scored in windows
        share = audit.windowed_rows / overall.ok if overall.ok else 0.0
        cards.insert(2, (_pct(share), f"scored in windows ({_rows(audit.windowed_rows)} longer than the model's)"))
    boxes = "".join(f"<div class='card'><b>{_e(value)}</b><span>{_e(label)}</span></div>" for value, label in cards)
    return f"<div class='cards'>{boxes}</div>"


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def _partition_table(audit: AuditRecord, comparison: Comparison | None) -> str:
    """Every partition's figures; baseline, change and status columns only when there is a baseline."""
    rows = partition_rows(audit, comparison)
    overall = scope_row(OVERALL, audit.overall, comparison.overall if comparison else None, audit.metric)
    columns = ["partition", "rows", "errors", "error rate", "PPPL token", "PPPL word", "outliers"]
    columns += ["baseline", "change", "status"] if comparison else []
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    body = [_table_row(overall, "overall", comparison is not None)]
    body += [_table_row(r, _CSS_CLASS.get(r.status, ""), comparison is not None) for r in rows]
    more = (
        ""
        if len(rows) <= MAX_BARS
        else (
            f"<p class='note'>The chart shows {MAX_BARS} of {len(rows)} partitions: "
            "regressed and most changed first.</p>"
        )
    )
    return f"{more}<table>{head}{''.join(body)}</table>"


def _table_row(r: Row, css: str, compared: bool) -> str:
    f = r.figures
    cells = [f"<td>{_e(r.name)}</td>", *(_figure_cells(f) if f else ["<td class='num'>–</td>"] * 6)]
    if compared:
        cells += [
            f"<td class='num'>{_num(r.baseline)}</td>",
            f"<td class='num'>{_pct(r.change, signed=True)}</td>",
            f"<td title='{_e('; '.join(r.reasons))}'>{_e(r.status)}</td>",
        ]
    return f"<tr class='{_e(css)}'>{''.join(cells)}</tr>"


def _figure_cells(f: ScopeFigures) -> list[str]:
    return [
        _td(f.rows),
        _td(f.errors),
        f"<td class='num'>{_pct(f.error_rate)}</td>",
        f"<td class='num'>{_num(f.pppl_token)}</td>",
        f"<td class='num'>{_num(f.pppl_word)}</td>",
        _td(f.outliers),
    ]


def _td(value: int | None) -> str:
    return f"<td class='num'>{'–' if value is None else f'{value:,}'}</td>"


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
    return note + _img(positionwise_chart(curves), "positionwise cross-entropy")


def _floored(cutoff: Cutoff) -> bool:
    """Whether the cutoff's sigma is the rule's floor rather than the spread measured."""
    return cutoff.measured_sigma is not None and cutoff.measured_sigma < cutoff.sigma


def _unknown_rows(unknown: UnknownTokens | None) -> list[str]:
    """The rows made mostly of unknown tokens, apart from the outliers: every model gives its unknown token
    some fixed NLL, so their scores say nothing of the text, and a few of them in a partition would widen its
    outlier cutoff past everything else. Nothing for an audit.json written before they were kept apart."""
    if unknown is None:
        return []
    parts = ["<h2>Rows mostly of unknown tokens</h2>"]
    by = ", ".join(f"{name}: {n:,}" for name, n in unknown.by_partition.items())
    shown = f"; the first {len(unknown.listed)}, in row order" if unknown.listed else ""
    parts.append(
        f"<p class='note'>{_e(_rows(unknown.count))} ({_e(unknown.rule)}){_e(f' ({by})' if by else '')}: their PLL "
        f"measures the tokenizer, not the text, so they are kept out of the outlier rule (neither counted as "
        f"outliers nor part of any cutoff's median and spread){_e(shown)}.</p>"
    )
    if unknown.listed:
        head = (
            "<tr><th>#</th><th>id</th><th>partition</th><th>unknown</th><th>tokens</th><th>NLL/token</th>"
            "<th>text</th></tr>"
        )
        body = "".join(
            f"<tr><td class='num'>{rank}</td><td>{_e(row.id)}</td><td>{_e(row.partition)}</td>"
            f"<td class='num'>{row.unknown_share:.0%}</td><td class='num'>{row.n_tokens}</td>"
            f"<td class='num'>{row.nll_per_token:.3f}</td>"
            f"<td class='text'>{_e(_cut(row.text, row.text_truncated))}</td></tr>"
            for rank, row in enumerate(unknown.listed, 1)
        )
        parts.append(f"<table>{head}{body}</table>")
    return parts


def _worst_rows(outliers: Outliers) -> list[str]:
    """The outlier rule and its count, then the highest rows by each scope's rule, flagged or not, each
    labelled, whatever the rule's scope: junk that came as a partition of its own is only seen overall, a
    fragment within a harder partition only per partition, and a night whose junk widened the rule still
    shows its worst rows. An audit.json written before both were kept has its rule's scope's list only."""
    worst = outliers.worst or {outliers.rule.scope: WorstRows(outliers.count, outliers.listed)}
    parts = [_outlier_intro(outliers)]
    for scope, (title, against) in _WORST.items():
        rows = worst.get(scope)
        parts.append(f"<h3>{title}</h3>")
        if rows is None:
            parts.append("<p class='note'>Not recorded: this audit.json was written before both lists were kept.</p>")
            continue
        parts.append(f"<p class='note'>{_e(_worst_note(outliers.rule, scope, rows, against))}</p>")
        if rows.listed:
            parts.append(_outlier_table(rows.listed, scope == outliers.rule.scope))
    return parts


def _cutoff_source(cutoff: Cutoff) -> str:
    """Whose median and spread a cutoff is, when not tonight's own rows'."""
    if cutoff.source == BASELINE:
        return " (the baseline's)"
    if cutoff.source == SERIES:
        nights = cutoff.nights or []
        span = f"{nights[0]} to {nights[-1]}" if len(nights) > 1 else "".join(nights)
        return f" (the series': median of {len(nights)} reference night{'s' * (len(nights) != 1)}, {span})"
    return ""


def _outlier_intro(outliers: Outliers) -> str:
    rule = outliers.rule
    tails = "both tails" if rule.low_tail else "high tail"
    cutoffs = "; ".join(
        f"{name}: median {c.median:.3f}, sigma {c.sigma:.3f}"
        + _cutoff_source(c)
        + (f" (the floor: {c.measured_sigma:.4f} measured)" if _floored(c) else "")
        + f", above {c.high:.3f}"
        + (f" or below {c.low:.3f}" if c.low is not None else "")
        for name, c in list(outliers.cutoffs.items())[:5]
    )
    floor = f", sigma at least {rule.min_sigma:g} nats per token" if rule.min_sigma else ""
    return (
        f"<p class='note'>{outliers.count:,} of {outliers.eligible:,} sentences flagged: NLL per token beyond "
        f"median ± {rule.k:g} · 1.4826 · MAD ({tails}, scope {_e(rule.scope)}, "
        f"at least {rule.min_tokens} tokens{floor}). {_e(cutoffs)}. All flagged rows are in {_e(outliers.file)}. "
        "Rows mostly of unknown tokens are not judged by the rule (listed above). Below, the highest rows by one "
        "rule for the whole corpus and by one rule per partition, whatever the scope, flagged or not, each "
        "labelled: only those labelled outlier are counted.</p>"
    )


def _worst_note(rule: OutlierRuleRecord, scope: str, rows: WorstRows, against: str) -> str:
    beyond = f"{'beyond median ±' if rule.low_tail else 'above median +'} {rule.k:g} sigma of {against}"
    counted = (
        "the outliers counted above"
        if scope == rule.scope
        else f"not counted as outliers under scope {rule.scope}; --outlier-scope {scope} counts them"
    )
    shown = f"; the {len(rows.listed)} highest, flagged or not:" if rows.listed else "."
    return f"{rows.count:,} rows {beyond} ({counted}){shown}"


def _outlier_table(listed: list[Listed], counted: bool) -> str:
    """A list of highest rows; `counted`: its rule is the one whose flagged rows are the outliers counted."""
    head = (
        "<tr><th>#</th><th>id</th><th>partition</th><th>NLL/token</th><th>PPPL</th><th>z</th><th>flagged</th>"
        "<th>tokens</th><th>hardest token (t, nats)</th><th>text</th></tr>"
    )
    body = [_outlier_row(rank, row, counted) for rank, row in enumerate(listed, 1)]
    return f"<table>{head}{''.join(body)}</table>"


def _flag_label(row: Listed, counted: bool) -> str:
    """outlier (flagged by the rule that counts), beyond a rule that does not count, or not flagged; a file
    written before the label listed flagged rows only."""
    flagged = row.flagged is not False
    if flagged and counted:
        return "outlier"
    return "beyond this rule, not counted" if flagged else "not flagged"


def _cut(text: str, truncated: bool) -> str:
    return text[:_TEXT_CHARS] + ("…" if truncated or len(text) > _TEXT_CHARS else "")


def _outlier_row(rank: int, row: Listed, counted: bool) -> str:
    worst = "–" if row.worst_token is None else f"{row.worst_token} (t={row.worst_position}, {row.worst_token_nll:.2f})"
    label = _flag_label(row, counted)
    return (
        f"<tr class='{'' if label == 'not flagged' else 'flagged'}'><td class='num'>{rank}</td>"
        f"<td>{_e(row.id)}</td><td>{_e(row.partition)}</td>"
        f"<td class='num'>{row.nll_per_token:.3f}</td><td class='num'>{_num(row.pppl_token)}</td>"
        f"<td class='num'>{row.robust_z:+.1f}</td><td>{_e(label)}</td><td class='num'>{row.n_tokens}</td>"
        f"<td>{_e(worst)}</td><td class='text'>{_e(_cut(row.text, row.text_truncated))}</td></tr>"
    )


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
