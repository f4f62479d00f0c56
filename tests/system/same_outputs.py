"""Every command's outputs on a fixed corpus, and a comparison of two such sets (a refactor must
leave every Parquet table and JSON file as it was).

    python tests/system/same_outputs.py run OUT [--models DIR]       # every command into OUT/<command>
    python tests/system/same_outputs.py compare BEFORE AFTER [--noise AGAIN]

`run` builds the tiny random BERT of tests/helpers/tiny.py once (into --models, shared by the runs compared, so
both score with the same weights), writes a fixed corpus and plays `dscore score` (PLL, per token),
`score --method unmasked`, `audit` (partitioned, then against itself as baseline), `rescore`, `joints`,
`infill`, `sample` and `generate`, each in this process's CLI (`distributed_scoring.cli.main`), without Ray.

`compare` reads every Parquet file (as Arrow tables: schema and values) and every JSON file of both sets
and lists what differs. Some values differ between two runs of the same code (times, dates, the output
folder's own path, Ray-less timings): with `--noise AGAIN` (a second `run` of the BEFORE code into another
folder), a difference that also appears between BEFORE and AGAIN is noise, and only the others count.
Exit code 0: nothing but noise differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helper package (tests/helpers/tiny.py)

MASKED = [
    "the quick brown [MASK] jumps",
    "she sells [MASK] by the seashore",
    "a [MASK] dog",
    "colourless green [MASK] sleep furiously",
]


def write_inputs(d: Path) -> dict[str, str]:
    """The fixed inputs: a corpus with a bad line, partitioned JSONL, N-best lists, masked texts and prompts."""
    from helpers import tiny

    d.mkdir(parents=True, exist_ok=True)
    texts = [*tiny.CORPUS, "", "x " * 300]
    (d / "corpus.txt").write_text("".join(t + "\n" for t in texts))
    (d / "parts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"r{i}", "text": t, "source": f"s{i % 3}"}) + "\n" for i, t in enumerate(tiny.CORPUS * 3)
        )
    )
    for split, offset in (("dev", 0), ("test", 3)):
        records = [
            {
                "utt_id": f"{split}{u}",
                "hyp_id": h,
                "text": tiny.CORPUS[(u + h + offset) % len(tiny.CORPUS)],
                "score": -1.0 * h - u / 10,
                "ref": tiny.CORPUS[(u + 1 + offset) % len(tiny.CORPUS)],
            }
            for u in range(4)
            for h in range(1, 4)
        ]
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "masked.jsonl").write_text(
        "".join(json.dumps({"id": f"m{i}", "text": t}) + "\n" for i, t in enumerate(MASKED))
    )
    (d / "filled.jsonl").write_text(
        "".join(json.dumps({"id": f"s{i}", "text": t.replace("[MASK]", "cat")}) + "\n" for i, t in enumerate(MASKED))
    )
    (d / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"id": f"g{i}", "text": t}) + "\n"
            for i, t in enumerate(["the [MASK] [MASK] dog", "[MASK] quick [MASK]", "she [MASK] [MASK]"])
        )
    )
    return {
        name: str(d / name)
        for name in (
            "corpus.txt",
            "parts.jsonl",
            "dev.jsonl",
            "test.jsonl",
            "masked.jsonl",
            "filled.jsonl",
            "prompts.jsonl",
        )
    }


def commands(inputs: dict[str, str], model: str, out: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of every command played, in order (audit-again reads audit's folder as its baseline)."""
    m = ["--model", model]
    audit = ["audit", inputs["parts.jsonl"], "--id-column", "id", "--partition-column", "source", *m, "--min-rows", "2"]
    return [
        ("score", ["score", inputs["corpus.txt"], *m, "--per-token", "--shard-rows", "4"]),
        ("score-unmasked", ["score", inputs["corpus.txt"], *m, "--method", "unmasked"]),
        ("audit", audit),
        ("audit-again", [*audit, "--baseline", str(out / "audit")]),
        ("rescore", ["rescore", "--dev", inputs["dev.jsonl"], "--test", inputs["test.jsonl"], *m]),
        ("joints", ["joints", inputs["corpus.txt"], *m, "--examples", "4"]),
        ("infill", ["infill", inputs["masked.jsonl"], "--id-column", "id", *m, "--beam", "2"]),
        ("sample", ["sample", inputs["filled.jsonl"], "--id-column", "id", *m, "--epochs", "2"]),
        ("generate", ["generate", inputs["prompts.jsonl"], "--id-column", "id", *m]),
    ]


def run(out: Path, models: Path) -> int:
    from distributed_scoring.cli import main

    from helpers import tiny

    model = models / "bert"
    if not (model / "config.json").exists():
        tiny.save_tiny("bert", model)
    inputs = write_inputs(out / "inputs")
    failed = []
    for name, argv in commands(inputs, str(model), out):
        code = main([*argv, "--output", str(out / name)])
        print(f"{name}: exit {code}", flush=True)
        if code not in (0, 3, 5):  # an audit may end with a verdict of its own
            failed.append(name)
    return 1 if failed else 0


def outputs(folder: Path) -> Iterator[Path]:
    """Every Parquet and JSON file of a set, relative to it (logs and locks are not outputs)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in (".parquet", ".json") and "inputs" not in path.parts:
            yield path.relative_to(folder)


def differences(a: Path, b: Path) -> set[str]:
    """What differs between two sets: missing files, and per file the paths of differing values."""
    found: set[str] = set()
    files_a, files_b = set(outputs(a)), set(outputs(b))
    found |= {f"only in one: {f}" for f in files_a ^ files_b}
    for f in sorted(files_a & files_b):
        if f.suffix == ".parquet":
            found |= {f"{f}: {d}" for d in _table_differences(a / f, b / f)}
        else:
            found |= {
                f"{f}: {d}"
                for d in _json_differences(json.loads((a / f).read_text()), json.loads((b / f).read_text()), "", a, b)
            }
    return found


def _table_differences(a: Path, b: Path) -> set[str]:
    import pyarrow.parquet as pq

    ta, tb = pq.read_table(a), pq.read_table(b)
    if not ta.schema.equals(tb.schema, check_metadata=False):
        return {"schema"}
    if ta.num_rows != tb.num_rows:
        return {"rows"}
    return {f"column {c}" for c in ta.column_names if not ta[c].equals(tb[c])}


def _json_differences(x: Any, y: Any, at: str, a: Path, b: Path) -> set[str]:
    if isinstance(x, dict) and isinstance(y, dict):
        x = {k.replace(str(a), "<set>"): v for k, v in x.items()}  # keys naming a path inside the set
        y = {k.replace(str(b), "<set>"): v for k, v in y.items()}
        found = {f"{at}/{k}: only in one" for k in x.keys() ^ y.keys()}
        for k in x.keys() & y.keys():
            found |= _json_differences(x[k], y[k], f"{at}/{k}", a, b)
        return found
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return {f"{at}: length"}
        return set().union(*(_json_differences(u, v, f"{at}[]", a, b) for u, v in zip(x, y)))
    if isinstance(x, str) and isinstance(y, str) and x.replace(str(a), "") == y.replace(str(b), ""):
        return set()  # the same path inside each set
    return set() if x == y else {at}


def compare(before: Path, after: Path, noise: Path | None) -> int:
    found = differences(before, after)
    expected = differences(before, noise) if noise is not None else set()
    real = sorted(found - expected)
    print(
        f"{len(list(outputs(before)))} files compared; {len(found)} differences, {len(found & expected)} of them "
        f"also between two runs of the same code (noise)"
    )
    for line in real:
        print(f"  DIFFERS {line}")
    print("SAME" if not real else f"{len(real)} real differences")
    return 0 if not real else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands_ = parser.add_subparsers(dest="what", required=True)
    r = commands_.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--models", type=Path, default=Path("out/same-outputs-models"))
    c = commands_.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--noise", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "run":
        return run(args.out.resolve(), args.models.resolve())
    return compare(args.before.resolve(), args.after.resolve(), args.noise.resolve() if args.noise else None)


if __name__ == "__main__":
    sys.exit(main())
