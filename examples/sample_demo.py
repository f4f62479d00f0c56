"""Sampling demo on real weights: AntiBERTy samples CDR3 variants of germline heavy chains.

Each row joins a human IMGT germline heavy V gene to a human J gene; its CDR3 (the V gene's residues
after the conserved cysteine, `--middle` free residues for the D/N region, and the J gene's residues
before the conserved tryptophan) is masked and sampled, the framework around it is fixed context. Three
runs sample the same rows with the same seeds: MH on E_raw, MH on E_norm (both Goyal et al., 2022) and
the degenerate Gibbs sampler, every chain warm-started (greedy fill) and restricted to the 20 amino acids.
The report (`report.html`, `report.png`, `table.md`) shows acceptance and novel-transition rates, both
energies by epoch, and the distinct CDR3s each run visited.

Energies sum over every position of the sequence (one masked copy each), so their cost grows with the
square of its length: by default a row keeps the `--context` residues of framework 3 before the CDR3
and framework 4 after it (about 35 residues: the three runs took 28 CPU-minutes, so about 15 minutes on
2 quiet cores, most of it in the MH runs' energies); `--context 200` keeps the whole V gene (about 120
residues, over 10x the cost).

    python examples/sample_demo.py --output out/sample-demo [--rows 4] [--chains 2] [--epochs 6] [--ray]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyarrow.parquet as pq

from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import germlines, spaced, v_genes
from distributed_scoring.offline.models import fetch_model

AMINO_ACIDS = "A C D E F G H I K L M N P Q R S T V W Y"
RUNS = [("mh", "raw"), ("mh", "norm"), ("gibbs", "norm")]


def cdr3_rows(count: int, context: int, middle: int) -> list[dict]:
    """Rows {id, text, cdr3_length}: V genes spread over the sorted list, J1-J6 in turn."""
    j_genes = sorted((n, s.replace("-", "")) for n, s in germlines()["J"]["H"]["human"].items() if n.endswith("*01"))
    v = sorted(v_genes("human").items())
    rows = []
    for i, (v_name, v_seq) in enumerate(v[:: max(1, len(v) // count)][:count]):
        j_name, j_seq = j_genes[i % len(j_genes)]
        cys, trp = v_seq.rindex("C"), j_seq.index("W")
        length = len(v_seq) - cys - 1 + middle + trp
        text = " ".join(
            [
                spaced(v_seq[max(0, cys + 1 - context) : cys + 1]),
                *["[MASK]"] * length,
                spaced(j_seq[trp : trp + context]),
            ]
        )
        rows.append({"id": f"{v_name}+{j_name}", "text": text, "cdr3_length": length})
    return rows


def per_epoch(folder: Path) -> tuple[dict[int, dict], dict[str, set[str]]]:
    """Rates and mean energies by recorded epoch, and the CDR3s each row visited (all chains)."""
    rows = pq.read_table(folder / "rows").to_pylist()
    by_epoch: dict[int, dict] = {}
    visited: dict[str, set[str]] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        e = by_epoch.setdefault(r["epoch"], {"proposals": 0, "accepted": 0, "novel": 0, "raw": [], "norm": []})
        for key in ("proposals", "accepted", "novel"):
            e[key] += r[key]
        e["raw"].append(r["energy_raw"])
        e["norm"].append(r["energy_norm"])
        visited.setdefault(r["id"], set()).add(r["sampled"].replace(" ", ""))
    return {
        epoch: {
            "acceptance": e["accepted"] / e["proposals"],
            "novel": e["novel"] / e["proposals"],
            "raw": sum(e["raw"]) / len(e["raw"]),
            "norm": sum(e["norm"]) / len(e["norm"]),
        }
        for epoch, e in sorted(by_epoch.items())
    }, visited


def plot(curves: dict[str, dict[int, dict]], path: Path) -> None:
    figure, axes = plt.subplots(2, 2, figsize=(9, 6))
    for ax, (key, label) in zip(
        axes.flat,
        (
            ("acceptance", "acceptance rate"),
            ("novel", "novel transition rate"),
            ("raw", "mean E_raw"),
            ("norm", "mean E_norm (= -PLL)"),
        ),
    ):
        for name, by_epoch in curves.items():
            ax.plot(list(by_epoch), [v[key] for v in by_epoch.values()], marker="o", label=name)
        ax.set_xlabel("epoch (burn-in included)")
        ax.set_ylabel(label)
    axes[0, 0].legend()
    figure.suptitle("AntiBERTy CDR3 sampling: MH on E_raw and E_norm vs degenerate Gibbs")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def render(
    summaries: dict[str, dict], visited: dict[str, dict[str, set[str]]], rows: list[dict], chains: int, records: int
) -> str:
    lines = [
        f"AntiBERTy, {len(rows)} germline heavy chains (V + J, CDR3 of "
        f"{min(r['cdr3_length'] for r in rows)}-{max(r['cdr3_length'] for r in rows)} masked residues), "
        f"{chains} warm-started chains each, 20 amino acids; rates over all recorded epochs.",
        "",
        "| run | acceptance | novel transitions | final mean E_raw | final mean E_norm | "
        f"distinct CDR3s per row (of {records} recorded) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in summaries.items():
        last = s["energy_by_epoch"][max(s["energy_by_epoch"], key=int)]
        distinct = sum(len(v) for v in visited[name].values()) / len(visited[name])
        lines.append(
            f"| {name} | {s['acceptance_rate']:.3f} | {s['novel_rate']:.3f} | {last['raw']:.1f} | "
            f"{last['norm']:.1f} | {distinct:.1f} |"
        )
    return "\n".join(lines) + "\n"


def html(table: str, png: Path, visited: dict[str, dict[str, set[str]]]) -> str:
    from html import escape

    body = [
        f"<h1>AntiBERTy CDR3 sampling</h1><pre>{escape(table)}</pre>",
        f'<img alt="rates and energies by epoch" src="data:image/png;base64,'
        f'{base64.b64encode(png.read_bytes()).decode()}">',
        "<h2>CDR3s visited (first row)</h2>",
    ]
    for name, by_row in visited.items():
        row, cdr3s = sorted(by_row.items())[0]
        body.append(f"<h3>{escape(name)}: {escape(row)}</h3><p>{escape(', '.join(sorted(cdr3s)[:20]))}</p>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>CDR3 sampling</title></head><body>"
        + "".join(body)
        + "</body></html>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/sample-demo", help="folder of the runs and the report")
    parser.add_argument("--rows", type=int, default=4, help="germline heavy chains")
    parser.add_argument("--chains", type=int, default=2, help="chains per row")
    parser.add_argument("--epochs", type=int, default=6, help="recorded epochs after burn-in")
    parser.add_argument("--burn-in", type=int, default=2)
    parser.add_argument("--middle", type=int, default=6, help="free CDR3 residues between the V and J germline ends")
    parser.add_argument("--context", type=int, default=16, help="framework residues kept on each side of the CDR3")
    parser.add_argument("--seed", type=int, default=0)
    args, extra = parser.parse_known_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    model = str(fetch_model("antiberty"))
    rows = cdr3_rows(args.rows, args.context, args.middle)
    inputs = output / "cdr3.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summaries, curves, visited = {}, {}, {}
    for sampler, energy in RUNS:
        name = f"{sampler} on E_{energy}"
        folder = output / f"{sampler}-{energy}"
        rc = dscore(
            [
                "sample",
                str(inputs),
                "--model",
                model,
                "--output",
                str(folder),
                "--id-column",
                "id",
                "--sampler",
                sampler,
                "--energy",
                energy,
                "--chains",
                str(args.chains),
                "--epochs",
                str(args.epochs),
                "--burn-in",
                str(args.burn_in),
                "--vocab-restrict",
                AMINO_ACIDS,
                "--seed",
                str(args.seed),
                "--overwrite",
                *extra,
            ]
        )
        if rc != 0:
            return rc
        summaries[name] = json.loads((folder / "summary.json").read_text())
        curves[name], visited[name] = per_epoch(folder)
    table = render(summaries, visited, rows, args.chains, args.chains * args.epochs)
    plot(curves, output / "report.png")
    (output / "table.md").write_text(table)
    (output / "report.html").write_text(html(table, output / "report.png", visited))
    print("\n" + table + f"\nreport: {output / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
