"""`dscore variants`' report: report.md (the per-assay table: variants, scored, Spearman with DMS_score and AUC
of DMS_score_bin with their bootstrap intervals, and the forward passes; ProteinGym's figures per assay and depth,
and their averages with a reference file) and scatter.png (each assay's scores
against its measurements, the first `MAX_PANELS` assays by name)."""

from __future__ import annotations

import io
import math
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...io import schema as S
from ...io.claim import Claim
from ...io.dms import DMS_ID, DMS_SCORE, numbers_of
from ...io.output import REPORT_MD
from .proteingym import DEPTHS, METRICS

MAX_PANELS = 16
SCATTER = "scatter.png"


def write_report(folder: Claim, variants: pa.Table, summary: dict) -> None:
    folder.out.write_bytes(SCATTER, scatter(variants, summary))
    folder.record(SCATTER)
    folder.write_text(REPORT_MD, markdown(summary))


def _estimate(figure: dict | None) -> str:
    if not figure or figure.get("value") is None:
        return f"- ({figure['reason']})" if figure and "reason" in figure else "-"
    low, high = figure["interval"]
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
    return f"{figure['value']:.3f}{interval}"


def markdown(summary: dict) -> str:
    """The per-assay table and what the run cost."""
    lines = [
        f"# Variant effects: {summary['strategy']}",
        "",
        f"Model `{summary['model']}`; {summary['variants']} variants in {summary['assays']} assay(s), "
        f"{summary['ok']} scored, {summary['errors']} error rows; {summary['forward_passes']} forward passes "
        f"(sequences through the model); {summary['seconds']:.1f} s from reading the tables to the statistics.",
        "",
        "Spearman: of `score` with `DMS_score`; AUC: of `score` for `DMS_score_bin`; 95% bootstrap intervals "
        "(1,000 resamples of the scored variants).",
        "",
        "| assay | length | variants | scored | Spearman | AUC |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, a in sorted(summary["by_assay"].items()):
        lines.append(
            f"| {name} | {a['target_length']} | {a['variants']} | {a['ok']} | {_estimate(a.get('spearman'))} "
            f"| {_estimate(a.get('auc'))} |"
        )
    lines += _proteingym(summary)
    lines += ["", f"![scores against measurements]({SCATTER})", ""]
    return "\n".join(lines)


def _value(figure: dict | None) -> str:
    return "-" if not figure or figure.get("value") is None else f"{figure['value']:.3f}"


def _proteingym(summary: dict) -> list[str]:
    """ProteinGym's figures: per assay, over it and by each mutation depth it has; with a reference file, the
    averages as ProteinGym takes them."""
    names = ("Spearman", "AUC", "MCC", "NDCG", "top 10% recall")
    lines = [
        "",
        "## ProteinGym's figures",
        "",
        "As ProteinGym's `performance_DMS_benchmarks.py` computes them (docs/variants.md says how); `-`: undefined "
        "(summary.json says why). By mutation depth, the depths an assay has.",
        "",
        f"| assay | depth | {' | '.join(names)} |",
        "|---|---|" + "---:|" * len(names),
    ]
    for name, a in sorted(summary["by_assay"].items()):
        rows = [("all", a), *((d, f) for d, f in a["by_depth"].items() if any(_value(f[m]) != "-" for m in METRICS))]
        lines += [f"| {name} | {depth} | {' | '.join(_value(f.get(m)) for m in METRICS)} |" for depth, f in rows]
    for strategy, averages in summary.get("proteingym", {}).items():
        lines += ["", f"Averages over selection types ({strategy}; {averages['assays']} assay(s) with a UniProt_ID and "
                  f"a coarse_selection_type), with ProteinGym's bootstrap standard error:", ""]  # fmt: skip
        if "reason" in averages:
            lines.append(f"- ({averages['reason']})")
            continue
        types = sorted(averages[METRICS[0]]["by_selection_type"])
        header = ["metric", "average", "SE", *types, *(f"depth {d}" for d in DEPTHS)]
        lines += [f"| {' | '.join(header)} |", "|---|" + "---:|" * (len(header) - 1)]
        for metric, label in zip(METRICS, names):
            m = averages[metric]
            cells = [m.get("value"), m["standard_error"], *(m["by_selection_type"][t] for t in types)]
            cells += [m["by_depth"][d] for d in DEPTHS]
            lines.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    return lines


def scatter(variants: pa.Table, summary: dict) -> bytes:
    """One panel per assay (the first MAX_PANELS by name): score against DMS_score, Spearman in the title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = sorted(summary["by_assay"])[:MAX_PANELS]
    cols = min(4, len(names)) or 1
    rows = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(3.2 * cols, 2.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, name in zip(axes, names):
        mine = variants.filter(pc.equal(variants[DMS_ID], name))
        rho = summary["by_assay"][name].get("spearman")
        ax.set_title(
            f"{name}" + (f"\nSpearman {rho['value']:.3f}" if rho and rho.get("value") is not None else ""), fontsize=8
        )
        ax.set_xlabel(f"score ({summary['strategy']})", fontsize=7)
        measured = numbers_of(mine, DMS_SCORE) if DMS_SCORE in mine.column_names else f"no {DMS_SCORE} to plot"
        if isinstance(measured, str):  # no DMS_score, or why it holds no numbers (the statistics skipped too)
            ax.text(0.5, 0.5, textwrap.fill(measured, 40), ha="center", va="center", transform=ax.transAxes, fontsize=7)
        else:
            ok = np.asarray(pc.equal(mine[S.STATUS], S.STATUS_OK).to_pylist(), dtype=bool)
            scores = mine["score"].to_numpy(zero_copy_only=False)
            ax.scatter(scores[ok], np.asarray(measured, dtype=float)[ok], s=4, alpha=0.4)
            ax.set_ylabel(DMS_SCORE, fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()
