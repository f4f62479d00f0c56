"""The audit's `report.html`: one self-contained page to look at, rendered from an audit.json dict.

The verdict comes first, then PPPL per partition against the baseline, the per-sentence PPPL
histogram, the positionwise cross-entropy curves and the worst sentences. Plots are drawn with
matplotlib's Agg canvas (no pyplot, no display, no global state) and embedded as base64 PNG, so the
file opens offline and can be mailed or archived as is. Every string from the data is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io

from .baseline import OVERALL

__all__ = ["render_report"]

MAX_BARS = 40  # partitions drawn in the bar chart (regressed and most changed first); the table has all
MAX_CURVES = 4  # sentence lengths drawn in the Figure-4 panel (the most frequent ones)
MIN_POSITION_TOKENS = 20  # positions with fewer tokens are too noisy to draw
_TEXT_CHARS = 300  # text shown per listed sentence

_LABELS = {"pppl_token": "PPPL per token", "pppl_word": "PPPL per word"}
_BLUE, _GREY, _RED = "#2b6cb0", "#a0aec0", "#c53030"

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
tr.regressed td { background: #fff5f5; }
img { max-width: 100%; display: block; margin: 8px 0; }
"""


def render_report(audit: dict, baseline: dict | None = None) -> str:
    """The report page for an audit.json dict; `baseline` (the previous audit) adds its histogram."""
    comparison = audit.get("baseline")
    body = [
        f"<h1>PPPL audit</h1><p class='meta'>{_meta(audit)}</p>",
        _verdict(comparison),
        _cards(audit),
        "<h2>Pseudo-perplexity per partition</h2>",
        _img(_partition_chart(audit, comparison), "PPPL per partition against the baseline"),
        _partition_table(audit, comparison),
        "<h2>Per-sentence pseudo-perplexity</h2>",
        _img(_histogram_chart(audit, baseline), "histogram of per-sentence PPPL"),
        _histogram_note(audit),
        "<h2>Positionwise cross-entropy</h2>",
        _positionwise(audit),
        "<h2>Worst sentences</h2>",
        _outlier_table(audit),
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


def _meta(audit: dict) -> str:
    signature = audit["signature"]
    scorers = signature if isinstance(signature, list) else [signature]
    who = "; ".join(f"{s['model']} ({s['variant']})" for s in scorers)
    return _e(f"{audit['rows_dir']} · scored by {who} · audited {audit['created']}")


def _verdict(comparison: dict | None) -> str:
    """The banner: what the nightly job returns, and why."""
    if comparison is None:
        return "<div class='verdict none'><h2>No baseline: figures only (exit 0)</h2></div>"
    verdict, code = comparison["verdict"], comparison["exit_code"]
    title = {
        "pass": f"PASS: the corpus and all partitions hold against the baseline (exit {code})",
        "regression": f"REGRESSION in {len(comparison['regressed'])} place(s) (exit {code})",
        "incomparable": f"INCOMPARABLE: baseline scored by another model or variant (exit {code})",
    }[verdict]
    checks = {OVERALL: comparison["overall"], **comparison["partitions"]}
    items = [
        f"<li><b>{_e(name)}</b>: {_e('; '.join(checks[name]['reasons']))}</li>" for name in comparison["regressed"]
    ]
    if comparison["signature_mismatch"]:
        items.append(f"<li>{_e(comparison['signature_mismatch'])}</li>")
    for label, key in (("new partitions", "new_partitions"), ("vanished partitions", "vanished_partitions")):
        if comparison[key]:
            items.append(f"<li>{label} (not judged): {_e(', '.join(comparison[key]))}</li>")
    items.append(f"<li>baseline: {_e(comparison['source'])}</li>")
    return f"<div class='verdict {verdict}'><h2>{_e(title)}</h2><ul>{''.join(items)}</ul></div>"


def _cards(audit: dict) -> str:
    overall, outliers = audit["overall"], audit["outliers"]
    cards = [
        (f"{overall['rows']:,}", "sentences"),
        (_pct(overall["error_rate"]), f"error rate ({overall['errors']:,} rows)"),
        (_num(overall["pppl_token"]), "PPPL per token"),
        (_num(overall["pppl_word"]), "PPPL per word"),
        (f"{outliers['count']:,}", f"outliers (k = {outliers['rule']['k']:g})"),
        (f"{len(audit['partitions'])}", "partitions"),
    ]
    boxes = "".join(f"<div class='card'><b>{_e(value)}</b><span>{_e(label)}</span></div>" for value, label in cards)
    return f"<div class='cards'>{boxes}</div>"


def _metric(audit: dict) -> str:
    return audit["config"]["thresholds"]["metric"]


def _partition_rows(audit: dict, comparison: dict | None) -> list[dict]:
    """One row per partition of this run or the baseline: figures, baseline, change, status."""
    checks = comparison["partitions"] if comparison else {}
    names = sorted(set(audit["partitions"]) | set(checks))
    return [_row(name, audit["partitions"].get(name), checks.get(name, {}), _metric(audit)) for name in names]


def _row(name: str, figures: dict | None, check: dict, metric: str) -> dict:
    return {
        "name": name,
        "figures": figures,
        "pppl": figures[metric] if figures else None,
        "baseline": check.get("baseline_pppl"),
        "change": check.get("pppl_change"),
        "status": check.get("status", "–"),
        "reasons": check.get("reasons", []),
    }


def _partition_chart(audit: dict, comparison: dict | None) -> bytes:
    """Horizontal grouped bars, baseline (grey) and this run (blue, red when regressed), change annotated."""
    rows = _partition_rows(audit, comparison)
    rows.sort(key=lambda r: (r["status"] != "regressed", -abs(r["change"] or 0.0), r["name"]))
    rows = sorted(rows[:MAX_BARS], key=lambda r: r["name"], reverse=True)  # top to bottom alphabetical
    fig, ax = _figure(10, 1.2 + 0.42 * max(len(rows), 2))
    y = list(range(len(rows)))
    height = 0.38 if comparison else 0.6
    if comparison:
        ax.barh([i + height / 2 for i in y], [r["baseline"] or 0 for r in rows], height, color=_GREY, label="baseline")
    colours = [_RED if r["status"] == "regressed" else _BLUE for r in rows]
    shift = -height / 2 if comparison else 0
    ax.barh([i + shift for i in y], [r["pppl"] or 0 for r in rows], height, color=colours, label="this run")
    values = [v for r in rows for v in (r["pppl"], r["baseline"]) if v]
    if values and max(values) / min(values) > 30:
        _log_x(ax)
    for i, r in zip(y, rows):
        if r["pppl"] is not None:
            ax.text(r["pppl"], i + shift, _bar_label(r, comparison is not None), va="center", fontsize=9)
    ax.set_yticks(y, [_short(r["name"], 28) for r in rows])
    ax.set_xlabel(f"{_LABELS[_metric(audit)]} (corpus level)")
    ax.margins(x=0.18)
    if comparison:
        fig.legend(loc="outside upper right", ncols=2, fontsize=9)
    return _png(fig)


def _bar_label(row: dict, compared: bool) -> str:
    """' 12.3 (+4.1%)' against the baseline, ' 12.3  [new]' without one, ' 12.3' with no baseline at all."""
    if row["change"] is not None:
        return f" {row['pppl']:.3g} ({row['change']:+.1%})"
    return f" {row['pppl']:.3g}" + (f"  [{row['status']}]" if compared else "")


def _partition_table(audit: dict, comparison: dict | None) -> str:
    """Every partition's figures; baseline, change and status columns only when there is a baseline."""
    rows = _partition_rows(audit, comparison)
    overall = _row(OVERALL, audit["overall"], comparison["overall"] if comparison else {}, _metric(audit))
    columns = ["partition", "rows", "errors", "error rate", "PPPL token", "PPPL word", "outliers"]
    columns += ["baseline", "change", "status"] if comparison else []
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    body = [_table_row(overall, "overall", comparison is not None)]
    body += [_table_row(r, r["status"], comparison is not None) for r in rows]
    more = "" if len(rows) <= MAX_BARS else (
        f"<p class='note'>The chart shows {MAX_BARS} of {len(rows)} partitions: regressed and most changed first.</p>"
    )
    return f"{more}<table>{head}{''.join(body)}</table>"


def _table_row(r: dict, css: str, compared: bool) -> str:
    f = r["figures"] or {}
    cells = [
        f"<td>{_e(r['name'])}</td>", _td(f.get("rows")), _td(f.get("errors")),
        f"<td class='num'>{_pct(f.get('error_rate'))}</td>", f"<td class='num'>{_num(f.get('pppl_token'))}</td>",
        f"<td class='num'>{_num(f.get('pppl_word'))}</td>", _td(f.get("outliers")),
    ]
    if compared:
        cells += [
            f"<td class='num'>{_num(r['baseline'])}</td>", f"<td class='num'>{_pct(r['change'], signed=True)}</td>",
            f"<td title='{_e('; '.join(r['reasons']))}'>{_e(r['status'])}</td>",
        ]
    return f"<tr class='{_e(css)}'>{''.join(cells)}</tr>"


def _td(value: int | None) -> str:
    return f"<td class='num'>{'–' if value is None else f'{value:,}'}</td>"


def _histogram_chart(audit: dict, baseline: dict | None) -> bytes:
    """Share of sentences per log-spaced PPPL bin, this run against the baseline's, with the outlier cutoff."""
    hist = audit["histogram"]
    edges, counts = hist["edges"], hist["overall"]["counts"]
    fig, ax = _figure(10, 4.2)
    ax.stairs(_shares(counts), edges, fill=True, color=_BLUE, alpha=0.55, label="this run")
    base = baseline["histogram"] if baseline else None
    if base and base["edges"] == edges:
        ax.stairs(_shares(base["overall"]["counts"]), edges, color="#1a202c", linewidth=1.5, label="baseline")
    cutoff = audit["outliers"]["cutoffs"].get(OVERALL)
    if cutoff and cutoff["high_pppl"] and edges[0] <= cutoff["high_pppl"] <= edges[-1]:
        ax.axvline(cutoff["high_pppl"], color=_RED, linestyle="--", linewidth=1.2,
                   label=f"outlier cutoff ({cutoff['high_pppl']:.3g})")
    _log_x(ax)
    ax.set_xlim(*_occupied_range(edges, counts, base["overall"]["counts"] if base and base["edges"] == edges else None))
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


def _histogram_note(audit: dict) -> str:
    overall = audit["histogram"]["overall"]
    edges = audit["histogram"]["edges"]
    return (
        f"<p class='note'>{sum(overall['counts']):,} scored sentences in {len(edges) - 1} bins from {edges[0]:g} "
        f"to {edges[-1]:g}; {overall['underflow']:,} below, {overall['overflow']:,} above.</p>"
    )


def _positionwise(audit: dict) -> str:
    curves = audit["positionwise"]
    if curves is None:
        return "<p class='note'>No per-token log-probabilities in the rows: score with --per-token to get them.</p>"
    note = (
        "<p class='note'>-log p(w<sub>t</sub> | W<sub>\\t</sub>), natural log, at position t among the scored tokens. "
        "Left: every sentence long enough to have position t. Right: sentences of one exact length, as in "
        "Salazar et al. (2020), Figure 4, where a flat curve is expected; spikes point at systematic problems.</p>"
    )
    return note + _img(_positionwise_chart(curves), "positionwise cross-entropy")


def _positionwise_chart(curves: dict) -> bytes:
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = _figure(11, 4.2, panels=2)
    by_position = curves["by_position"]
    means, tokens = by_position["mean_nll"], by_position["tokens"]
    shown = [(t, mean) for t, (mean, n) in enumerate(zip(means, tokens), 1) if n >= MIN_POSITION_TOKENS]
    if shown:
        left.plot(*zip(*shown), color=_BLUE, linewidth=1.5)
    left.set_title(f"by absolute position (positions with ≥ {MIN_POSITION_TOKENS} tokens)", fontsize=10)
    frequent = sorted(curves["by_length"].items(), key=lambda kv: (-kv[1]["sentences"], int(kv[0])))[:MAX_CURVES]
    for length, curve in sorted(frequent, key=lambda kv: int(kv[0])):
        means = [s / curve["sentences"] for s in curve["sum_nll"]]
        right.plot(range(1, len(means) + 1), means, marker="o", markersize=3, linewidth=1.2,
                   label=f"|W| = {length} ({curve['sentences']:,} sentences)")
    right.set_title(f"by sentence length (the {len(frequent)} most frequent lengths)", fontsize=10)
    if frequent:
        right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_ylim(0, max(ax.dataLim.y1, 0.1) * 1.1)  # spikes read against the whole cross-entropy, not noise
        ax.set_xlabel("position t")
        ax.set_ylabel("mean cross-entropy (nats)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return _png(fig)


def _outlier_table(audit: dict) -> str:
    outliers = audit["outliers"]
    rule = outliers["rule"]
    tails = "both tails" if rule["low_tail"] else "high tail"
    cutoffs = "; ".join(
        f"{name}: median {c['median']:.3f}, sigma {c['sigma']:.3f}, above {c['high']:.3f}"
        + (f" or below {c['low']:.3f}" if c["low"] is not None else "")
        for name, c in list(outliers["cutoffs"].items())[:5]
    )
    intro = (
        f"<p class='note'>{outliers['count']:,} of {outliers['eligible']:,} sentences flagged: NLL per token beyond "
        f"median ± {rule['k']:g} · 1.4826 · MAD ({tails}, scope {_e(rule['scope'])}, "
        f"at least {rule['min_tokens']} tokens). {_e(cutoffs)}. All flagged rows are in {_e(outliers['file'])}; "
        f"the {len(outliers['listed'])} most extreme are listed.</p>"
    )
    if not outliers["listed"]:
        return intro
    head = "<tr><th>#</th><th>id</th><th>partition</th><th>NLL/token</th><th>PPPL</th><th>z</th><th>tokens</th>" \
           "<th>hardest token (t, nats)</th><th>text</th></tr>"
    body = []
    for rank, row in enumerate(outliers["listed"], 1):
        text = row["text"][:_TEXT_CHARS] + ("…" if row["text_truncated"] or len(row["text"]) > _TEXT_CHARS else "")
        worst = "–" if row["worst_token"] is None else (
            f"{row['worst_token']} (t={row['worst_position']}, {row['worst_token_nll']:.2f})"
        )
        body.append(
            f"<tr><td class='num'>{rank}</td><td>{_e(row['id'])}</td><td>{_e(row['partition'])}</td>"
            f"<td class='num'>{row['nll_per_token']:.3f}</td><td class='num'>{_num(row['pppl_token'])}</td>"
            f"<td class='num'>{row['robust_z']:+.1f}</td><td class='num'>{row['n_tokens']}</td>"
            f"<td>{_e(worst)}</td><td class='text'>{_e(text)}</td></tr>"
        )
    return f"{intro}<table>{head}{''.join(body)}</table>"


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
