"""Infilling demo on real weights: AntiBERTy fills 3-5 masked residues of germline heavy chains.

Each human IMGT germline heavy-chain V gene (fetched with the offline set) gets one contiguous span of k
residues masked at a seeded position; the true residues are the answer. Every decoder fills the same
rows (beam 5, the 20 amino acids only), and `exact` enumerates all 20^3 fills where k = 3, on the first
`--exact-chains` chains only (421 forward passes of a whole chain per row: about a minute a chain on 2
CPU cores); the table shows top-1 and top-5 exact-match accuracy of the whole span per decoder and span
length.

    python examples/infill_demo.py --output out/infill-demo [--chains 16] [--exact-chains 4] [--ray]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.offline.models import fetch_model

AMINO_ACIDS = "A C D E F G H I K L M N P Q R S T V W Y"
RUNS = [
    ("standard", "l2r"),
    ("standard", "best-to-worst"),
    ("hcb", "l2r"),
    ("hcb", "best-to-worst"),
    ("sample", "l2r"),
    ("temperature", "l2r"),
    ("top-k", "l2r"),
    ("top-p", "l2r"),
    ("exact", "l2r"),
]
EXACT_SPANS = (3,)  # 20^3 = 8,000 fills a row; 20^4 is over the default --exact-limit


def write_rows(path: Path, chains: dict[str, str], k: int, seed: int) -> None:
    """One JSONL row per chain: k residues masked at a seeded position, the truth as the answer."""
    rng = random.Random(f"{seed}/{k}")
    with path.open("w") as f:
        for name, chain in chains.items():
            start = rng.randrange(10, len(chain) - k - 10)
            masked = chain[:start] + "#" * k + chain[start + k :]
            text = spaced(masked).replace("#", "[MASK]")
            f.write(json.dumps({"id": name, "text": text, "answer": " ".join(chain[start : start + k])}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/infill-demo", help="folder of the runs and the table")
    parser.add_argument("--chains", type=int, default=16, help="germline chains filled per span length")
    parser.add_argument("--spans", default="3,4,5", help="span lengths (masked residues)")
    parser.add_argument("--exact-chains", type=int, default=4, help="chains `exact` fills (k = 3 only)")
    parser.add_argument("--seed", type=int, default=0)
    args, extra = parser.parse_known_args(argv)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    model = str(fetch_model("antiberty"))
    chains = dict(sorted(v_genes("human").items())[: args.chains])
    spans = [int(k) for k in args.spans.split(",")]
    results: dict[tuple[str, str], dict[int, dict]] = {}
    for k in spans:
        rows = output / f"rows-k{k}.jsonl"
        write_rows(rows, chains, k, args.seed)
        exact_rows = output / f"rows-k{k}-exact.jsonl"
        exact_rows.write_text("".join(rows.read_text().splitlines(keepends=True)[: args.exact_chains]))
        for decoder, order in RUNS:
            if decoder == "exact" and (k not in EXACT_SPANS or args.exact_chains < 1):
                continue
            folder = output / f"k{k}-{decoder}-{order}"
            rc = dscore(
                [
                    "infill",
                    str(exact_rows if decoder == "exact" else rows),
                    "--model",
                    model,
                    "--output",
                    str(folder),
                    "--id-column",
                    "id",
                    "--decoder",
                    decoder,
                    "--order",
                    order,
                    "--beam",
                    "5",
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
            results.setdefault((decoder, order), {})[k] = json.loads((folder / "summary.json").read_text())
    table = render(results, spans, len(chains), min(args.exact_chains, len(chains)))
    (output / "table.md").write_text(table)
    print("\n" + table)
    return 0


def render(results: dict[tuple[str, str], dict[int, dict]], spans: list[int], chains: int, exact: int) -> str:
    header = "| decoder | order | " + " | ".join(f"k={k} top-1 | k={k} top-5" for k in spans) + " |"
    lines = [
        f"AntiBERTy, {chains} human germline heavy chains per span length, beam 5, 20 amino acids; "
        "exact-match accuracy of the whole span.",
        "",
        header,
        "|---|---|" + "---:|" * (2 * len(spans)),
    ]
    for (decoder, order), by_k in results.items():
        cells = []
        for k in spans:
            accuracy = by_k.get(k, {}).get("accuracy")
            cells += [f"{accuracy['top1']:.3f}", f"{accuracy['top5']:.3f}"] if accuracy else ["n/a", "n/a"]
        name = f"exact, chain score (first {exact} chains)" if decoder == "exact" else decoder
        lines.append(f"| {name} | {order} | " + " | ".join(cells) + " |")
        if decoder == "exact":
            for key, name in (("accuracy_hcb", f"exact, HCB joint (first {exact} chains)"),):
                cells = []
                for k in spans:
                    accuracy = by_k.get(k, {}).get(key)
                    cells += [f"{accuracy['top1']:.3f}", f"{accuracy['top5']:.3f}"] if accuracy else ["n/a", "n/a"]
                lines.append(f"| {name} | {order} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
