r"""ProteinGym's substitution benchmark at its own scale: tables of the reference file's shape, built from its
published sizes with seeded random mutants, scored by `dscore variants --reference` in one command (issue 50,
item 3).

    .venv/bin/python benchmarks/proteingym_scale.py --output DIR [--scale 1.0] [--strategy wt-marginal]
        [--ray] [--model FOLDER] [--seed 0]

The shape (ProteinGym 1.3's `DMS_substitutions.csv`): 217 assays, 2,465,767 variants, 1,769,456 of them multiple
mutants in 69 assays; wild types of median 245 residues, the longest 3,423, 16 over 1,022 (ESM's window). Here:
201 lengths log-normal, scaled so that the 109th of the 217 is 245 and clipped to 40..1,022, and 16 uniform in
1,023..3,423 with one of 3,423. The 696,311 single substitutions are spread over every assay in proportion to a
random share of its 19 x L possible ones (never more); the multiple mutants over 69 assays of 100 to 1,022
residues, the first 480,000 (with its singles about ProteinGym's largest, 500,000) and the rest by log-normal
weights; depths 2 (80 %), 3 (12 %), 4 (5 %), 5 (2 %), 6 (1 %), sites distinct and in order, every mutant named
once per table. `DMS_score` is -0.5 per substitution plus unit noise, `DMS_score_bin` 1 where the noise is
positive (synthetic: the figures mean nothing). Each assay has its own random wild type (so that the lengths keep
their shape); the reference file groups neighbouring assays under one `UniProt_ID` (60 % start a new one) and gives
each one of ProteinGym's five `coarse_selection_type`s. `--scale F` keeps the 217 assays and the lengths and
multiplies every assay's rows by F (at least one single each), for a quick try.

The tables and the reference go to DIR/tables/ and DIR/reference.csv (reused when DIR/plan.json says they were
made with the same seed and scale), with the distinct mutated positions of each assay in DIR/plan.json. The run,
`dscore variants DIR/tables --reference DIR/reference.csv ...`, is a child process (through this file's `--child`,
which times `_read_assay`, `_summary` and `_write` of `workflows.variants.run` with benchmarks/variants.py's
`Phases`: the summary's `seconds` runs to the statistics, so they are not apart there); its wall time and peak
RSS (`os.wait4`: the child's, or the largest of its reaped descendants') are measured here. The forward passes the
plan costs are counted from the tables, as benchmarks/variants.py counts them (`Window`): masked-marginal one per
distinct mutated position of each wild type, wt-marginal one per window its positions need; the run's
`forward_passes` must equal them. The model, by default, is tests/helpers/tiny.py's tiny protein BERT (96
positions), built into DIR/model. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from variants import AMINO_ACIDS, Phases, Window  # noqa: E402

ASSAYS = 217
VARIANTS = 2_465_767
MULTIS = 1_769_456
MULTI_ASSAYS = 69
MEDIAN_LENGTH = 245
LONGEST = 3_423
ESM_WINDOW = 1_022
LONG_ASSAYS = 16
LARGEST_MULTIS = 480_000
DEPTHS = ((2, 0.80), (3, 0.12), (4, 0.05), (5, 0.02), (6, 0.01))
SELECTION_TYPES = ("Activity", "Binding", "Expression", "OrganismalFitness", "Stability")


# The shape.


def lengths(rng: random.Random) -> list[int]:
    """217 wild-type lengths: median 245, the longest 3,423, exactly 16 over 1,022, in a random order."""
    short = sorted(rng.lognormvariate(0, 0.6) for _ in range(ASSAYS - LONG_ASSAYS))
    middle = short[(ASSAYS + 1) // 2 - 1]  # the 109th of all 217: the 16 long ones are above it
    short = [min(ESM_WINDOW, max(40, round(x * MEDIAN_LENGTH / middle))) for x in short]
    long = [LONGEST] + [rng.randint(ESM_WINDOW + 1, LONGEST) for _ in range(LONG_ASSAYS - 1)]
    out = short + long
    rng.shuffle(out)
    return out


def spread(total: int, weights: list[float], caps: list[int]) -> list[int]:
    """`total` split in proportion to `weights`, none over its cap (the rest to those with room, largest first)."""
    scale = total / sum(weights)
    counts = [min(cap, int(w * scale)) for w, cap in zip(weights, caps)]
    while (left := total - sum(counts)) > 0:
        room = sorted(range(len(counts)), key=lambda i: counts[i] - caps[i])
        for i in room[:left]:
            counts[i] += min(1, caps[i] - counts[i])
    return counts


def shape(seed: int, scale: float) -> list[dict]:
    """Each assay's length and its singles and multiples (rows), scaled."""
    rng = random.Random(seed)
    sizes = lengths(rng)
    singles = spread(VARIANTS - MULTIS, [rng.uniform(0.2, 1) * 19 * n for n in sizes], [19 * n for n in sizes])
    eligible = [i for i, n in enumerate(sizes) if 100 <= n <= ESM_WINDOW]
    chosen = rng.sample(eligible, MULTI_ASSAYS)
    chosen.sort(key=lambda i: -sizes[i])  # the largest table on one of the longest of them
    weights = [rng.lognormvariate(0, 1.2) for _ in chosen[1:]]
    rest = spread(MULTIS - LARGEST_MULTIS, weights, [LARGEST_MULTIS] * len(weights))
    multis = dict(zip(chosen, [LARGEST_MULTIS, *rest]))
    return [
        {
            "length": n,
            "singles": max(1, round(singles[i] * scale)),
            "multis": round(multis.get(i, 0) * scale),
        }
        for i, n in enumerate(sizes)
    ]


def write_assay(path: Path, target: str, singles: int, multis: int, rng: random.Random) -> list[int]:
    """A table of distinct mutants with ProteinGym's columns; returns the distinct mutated positions (0-based)."""
    options = [[m for m in AMINO_ACIDS if m != w] for w in target]
    all_singles = [(i, m) for i in range(len(target)) for m in options[i]]
    names: dict[str, list[tuple[int, str]]] = {}
    for i, m in rng.sample(all_singles, singles):
        names[f"{target[i]}{i + 1}{m}"] = [(i, m)]
    depths, shares = zip(*DEPTHS)
    wanted = singles + multis
    while len(names) < wanted:
        sites = sorted(rng.sample(range(len(target)), rng.choices(depths, shares)[0]))
        subs = [(i, rng.choice(options[i])) for i in sites]
        names.setdefault(":".join(f"{target[i]}{i + 1}{m}" for i, m in subs), subs)
    positions: set[int] = set()
    with open(path, "w") as f:
        f.write("mutant,mutated_sequence,DMS_score,DMS_score_bin\n")
        for name, subs in names.items():
            residues = list(target)
            for i, m in subs:
                residues[i] = m
                positions.add(i)
            noise = rng.gauss(0, 1)
            f.write(f"{name},{''.join(residues)},{-0.5 * len(subs) + noise:.4f},{int(noise > 0)}\n")
    return sorted(positions)


def make_tables(folder: Path, seed: int, scale: float) -> dict:
    """DIR/tables/, DIR/reference.csv and DIR/plan.json (reused when made with the same seed and scale)."""
    plan_file = folder / "plan.json"
    if plan_file.exists():
        plan = json.loads(plan_file.read_text())
        if (plan["seed"], plan["scale"]) == (seed, scale):
            return plan
    began = time.monotonic()
    (folder / "tables").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed + 1)
    assays = []
    uniprot = 0
    for k, row in enumerate(shape(seed, scale)):
        uniprot += k == 0 or rng.random() < 0.6  # a new protein; else one more assay of the previous one
        target = "M" + "".join(rng.choice(AMINO_ACIDS) for _ in range(row["length"] - 1))
        dms_id = f"SYN{k:03d}_P{uniprot:03d}"
        positions = write_assay(folder / "tables" / f"{dms_id}.csv", target, row["singles"], row["multis"], rng)
        assays.append(
            {
                "DMS_id": dms_id,
                "DMS_filename": f"{dms_id}.csv",
                "target_seq": target,
                "UniProt_ID": f"P{uniprot:05d}_SYN",
                "coarse_selection_type": rng.choice(SELECTION_TYPES),
                "variants": row["singles"] + row["multis"],
                "multis": row["multis"],
                "positions": positions,
            }
        )
    columns = ("DMS_id", "DMS_filename", "target_seq", "UniProt_ID", "coarse_selection_type")
    with open(folder / "reference.csv", "w") as f:
        f.write(",".join(columns) + "\n")
        for a in assays:
            f.write(",".join(str(a[c]) for c in columns) + "\n")
    plan = {"seed": seed, "scale": scale, "seconds": round(time.monotonic() - began, 1), "assays": assays}
    plan_file.write_text(json.dumps(plan))
    return plan


def describe(plan: dict) -> dict:
    assays = plan["assays"]
    sizes = sorted(len(a["target_seq"]) for a in assays)
    return {
        "assays": len(assays),
        "variants": sum(a["variants"] for a in assays),
        "multis": sum(a["multis"] for a in assays),
        "multi_assays": sum(1 for a in assays if a["multis"]),
        "largest_assay": max(a["variants"] for a in assays),
        "median_length": sizes[len(sizes) // 2],
        "longest": sizes[-1],
        "over_1022": sum(1 for n in sizes if n > ESM_WINDOW),
        "proteins": len({a["UniProt_ID"] for a in assays}),
        "seconds_to_make": plan["seconds"],
    }


def planned_passes(plan: dict, strategy: str, model: str) -> int:
    """The forward passes the plan costs: per wild type, masked-marginal one per distinct mutated position,
    wt-marginal one per window of the model those positions need."""
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.engine.model_files import load_tokenizer
    from distributed_scoring.workloads.variants import residue_vocabulary

    tokenizer, max_length = load_tokenizer(ModelSpec(model))
    vocabulary = residue_vocabulary(tokenizer, model, "masked-marginal", plan["assays"][0]["target_seq"])
    total = 0
    for a in plan["assays"]:
        if strategy == "masked-marginal":
            total += len(a["positions"])
            continue
        window = Window(max_length, len(vocabulary.prefix), len(vocabulary.suffix), len(a["target_seq"]))
        total += len({window.start(i) for i in a["positions"]})
    return total


# The run.


def child(times: Path, argv: list[str]) -> int:
    """`dscore ARGV` in this process, the exclusive seconds of reading, statistics and writing kept in `times`."""
    from distributed_scoring.cli import main
    from distributed_scoring.workflows.variants import run as module

    phases = Phases()
    for attribute, phase in (("_read_assay", "read"), ("_summary", "statistics"), ("_write", "write")):
        phases.wrap(module, attribute, phase)
    try:
        return main(argv)
    finally:
        times.write_text(json.dumps(phases.seconds))


def measured(argv: list[str], folder: Path) -> dict:
    """The child's exit code, wall seconds, peak RSS and phases; its output to files in `folder`."""
    times = folder / "phases.json"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    began = time.monotonic()
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        process = subprocess.Popen(
            [sys.executable, __file__, "--child", str(times), *argv], stdout=out, stderr=err, env=env
        )
        _, status, usage = os.wait4(process.pid, 0)
    return {
        "rc": os.waitstatus_to_exitcode(status),
        "seconds": round(time.monotonic() - began, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "phases": {k: round(v, 1) for k, v in json.loads(times.read_text()).items()} if times.exists() else {},
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(Path(sys.argv[2]), sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="tables, the model and the runs go here")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of every assay's rows (1.0)")
    parser.add_argument("--strategy", choices=("wt-marginal", "masked-marginal"), default="wt-marginal")
    parser.add_argument("--ray", action="store_true", help="score on an embedded Ray (one actor)")
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny protein BERT)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    folder = args.output / f"scale-{args.scale:g}"
    plan = make_tables(folder, args.seed, args.scale)
    model = args.model
    if model is None:
        from helpers import tiny

        model = str(args.output / "model")
        if not Path(model, "config.json").exists():
            tiny.save_tiny_protein(Path(model), "bert")
    expected = planned_passes(plan, args.strategy, model)
    mode = "ray" if args.ray else "in-process"
    out = folder / f"run-{args.strategy}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    argv = ["variants", str(folder / "tables"), "--reference", str(folder / "reference.csv"), "--model", model]
    argv += ["--strategy", args.strategy, "--output", str(out / "dscore"), "--overwrite"]
    if args.ray:
        argv += ["--ray", "--num-actors", "1"]
    load_before = round(os.getloadavg()[0], 2)
    run = measured(argv, out)
    result = {"scale": args.scale, "strategy": args.strategy, "mode": mode, **describe(plan), **run}
    result.update(load_before=load_before, load_after=round(os.getloadavg()[0], 2), expected_passes=expected)
    summary_file = out / "dscore" / "summary.json"
    if run["rc"] == 0 and summary_file.exists():
        summary = json.loads(summary_file.read_text())
        statistics = run["phases"].get("statistics", 0.0)
        result.update(
            forward_passes=summary["forward_passes"],
            passes_exact=summary["forward_passes"] == expected,
            ok=summary["ok"],
            errors=summary["errors"],
            summary_seconds=summary["seconds"],
            statistics_share=round(statistics / run["seconds"], 3),
            spearman=summary["proteingym"][args.strategy]["spearman"].get("value"),
        )
    else:
        result["stderr_tail"] = (out / "stderr").read_text()[-2000:]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
