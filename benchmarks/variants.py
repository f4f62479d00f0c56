r"""`dscore variants` at deep-mutational-scan scale: 10^5 distinct variants of one 300-residue wild type, each
strategy's forward passes and seconds in this process and on an embedded Ray, and where the seconds go.

    .venv/bin/python benchmarks/variants.py [--variants 100000] [--length 300] [--model sapiens-vh]
        [--strategies wt-marginal masked-marginal mutant-marginal pll] [--modes in-process ray]
        [--sample mutant-marginal=10000 pll=100] [--num-actors 1] [--output DIR] [--json OUT.json]
        [--update-results benchmarks/RESULTS.md]

The table (a CSV of ProteinGym's columns, seeded): a random wild type over the 20 amino acids, all 19 x L single
substitutions, then random doubles and triples (half each, distinct, sites in order) up to --variants (fewer than
19 x L: a seeded sample of the singles); `DMS_score` is -0.5 per substitution plus unit noise, `DMS_score_bin` 1
above its median (synthetic: the Spearman and AUC they give mean nothing). Each strategy runs `dscore variants`
through `distributed_scoring.cli.main`, once in this process and once with `--ray --num-actors N` (an embedded
local Ray, started and stopped inside the run), after an untimed warm-up run of 20 variants per mode (imports,
the model's files, Ray's first start). Sapiens VH, the default model, reads 142 residues at a time (144 tokens),
so the 300-residue wild type is read in windows centred on each position (`engine.windows`): wt-marginal then
costs one pass per distinct window start its positions need (159 for all 300 positions), not one.

wt-marginal and masked-marginal run the whole table. mutant-marginal (a pass per window of each variant: 221,368
for the default 10^5) and pll (L masked copies per distinct sequence: 30,000,300) cannot on a small CPU:
`--sample STRATEGY=n` scores a seeded random n of the table's variants instead (10,000 and 100 by default: about
22,000 and 30,300 passes, enough that the start of Ray's scoring actor, which the model run's seconds include,
is a small part of them), and the full table's seconds are EXTRAPOLATED, and marked so: its forward passes
(exact, from the plan) at the passes/s of the sample's model run, plus the driver's phases of a marginal's run
of the whole table in the same mode (the same rows read, joined, summarised and written; else the sample's
scaled by the variants), plus the sample's Ray start and stop and `other`.

Every run's `forward_passes` (DIR/summary.json) must equal the count the plan gives, and every variant must be
scored; with Ray and in-process both run, their scores must agree within 1e-4; the harness stops otherwise.
Where the seconds go is measured from outside the package, by timing (exclusive of the timed calls inside) the
functions of `workflows.variants.run` as the run calls them: reading and parsing the table (`_read_assay`), the
sequences the model reads (`sequences`, `_digest`), Ray's start and stop (`ray.init`, `ray.shutdown`), the
model's run (`execute` or `run`, or `score` for pll: model load and Ray's actors included), reading its rows back
and joining them to the variants (the rest of `_site_tables`/`_plls`, and `variant_scores`), the statistics
(`_summary`: Spearman and AUC with 1,000 bootstrap resamples each) and writing (`_write`: variants.parquet,
summary, report, scatter plot); `other` is the rest of the wall time (the CLI, the tokenizer, the folder's claim,
inputs/sequences.parquet). DIR/summary.json's own `seconds` counts from the claim to the join: neither the
reading nor the statistics and writing, so the wall time is the figure reported.

Torch runs as `dscore` sets it (every usable CPU unless OMP_NUM_THREADS says otherwise, OpenMP's passive wait
policy, set here before torch is imported as the CLI sets it before it starts). The 1-minute load average
(os.getloadavg) is printed before and after every run and recorded in the JSON: run it on a quiet machine.
The figures of benchmarks/RESULTS.md, about 10-15 minutes on 2 quiet cores (mostly the two samples, twice):

    .venv/bin/python benchmarks/variants.py --json benchmarks/results/variants.json \
        --update-results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
STRATEGIES = ("wt-marginal", "masked-marginal", "mutant-marginal", "pll")
MODES = ("in-process", "ray")
DEFAULT_SAMPLE = {"mutant-marginal": 10_000, "pll": 100}
SCORE_TOLERANCE = 1e-4  # in-process against Ray, per variant (float32 model, different batching)
# The phases of a run, in the order they happen; `other` is the wall time outside them.
PHASES = ("read", "plan", "ray_start", "run", "read_back", "join", "statistics", "write", "ray_stop", "other")
DRIVER_PHASES = ("read", "plan", "read_back", "join", "statistics", "write")  # scale with the variants


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# The table.


def wild_type(length: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(AMINO_ACIDS) for _ in range(length))


def variant_names(target: str, n: int, seed: int) -> list[str]:
    """n distinct variants of `target`: every single substitution (a seeded sample of them when n is fewer), then
    seeded random doubles and triples, sites in increasing order, each named once."""
    rng = random.Random(seed + 1)
    singles = [f"{w}{i + 1}{m}" for i, w in enumerate(target) for m in AMINO_ACIDS if m != w]
    if n <= len(singles):
        return [singles[i] for i in sorted(rng.sample(range(len(singles)), n))]
    names = dict.fromkeys(singles)
    while len(names) < n:
        sites = sorted(rng.sample(range(len(target)), rng.choice((2, 3))))
        parts = [f"{target[i]}{i + 1}{rng.choice([m for m in AMINO_ACIDS if m != target[i]])}" for i in sites]
        names[":".join(parts)] = None
    return list(names)


def sites_of(name: str) -> list[tuple[int, str]]:
    """(0-based position, mutant residue) of each substitution of a name such as A23G:K45R."""
    return [(int(part[1:-1]) - 1, part[-1]) for part in name.split(":")]


def mutated(target: str, name: str) -> str:
    residues = list(target)
    for i, m in sites_of(name):
        residues[i] = m
    return "".join(residues)


def write_table(path: Path, target: str, names: list[str], seed: int) -> None:
    """A ProteinGym DMS table of the variants, with synthetic measurements."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv

    rng = np.random.default_rng(seed + 2)
    k = np.asarray([name.count(":") + 1 for name in names])
    score = -0.5 * k + rng.normal(size=len(names))
    columns = {
        "mutant": names,
        "mutated_sequence": [mutated(target, name) for name in names],
        "DMS_score": score,
        "DMS_score_bin": (score > np.median(score)).astype(np.int64),
    }
    pyarrow.csv.write_csv(pa.table(columns), str(path))


# What the plan costs.


class Window:
    """The model's window over the wild type, as `workloads.variants.SiteScorer` cuts it: the whole sequence when
    it fits (specials included), else one window of C residues per distinct start `engine.windows.window_start`
    gives the positions read."""

    def __init__(self, max_length: int, prefix: int, suffix: int, length: int) -> None:
        self.max_length, self.length = max_length, length
        self.fits = prefix + length + suffix <= max_length
        self.width = max_length - prefix - suffix  # C: residues in one window

    def start(self, i: int) -> int:
        from distributed_scoring.engine.windows import window_start

        return 0 if self.fits else window_start(i, self.length, self.width)


def expected_passes(strategy: str, target: str, names: list[str], window: Window) -> int:
    """The forward passes (sequences through the model, one masked copy = one) a strategy's run of `names` costs:
    wt-marginal, one per window of the wild type its variants' positions need; masked-marginal, one masked copy per
    distinct position; mutant-marginal, one per window of each variant; pll, L per distinct sequence, the wild type's
    included (its masked copies, windowed or not)."""
    if strategy == "pll":
        return len({target, *(mutated(target, name) for name in names)}) * len(target)
    if strategy == "mutant-marginal":
        return sum(len({window.start(i) for i, _ in sites_of(name)}) for name in names)
    positions = {i for name in names for i, _ in sites_of(name)}
    return len(positions) if strategy == "masked-marginal" else len({window.start(i) for i in positions})


# Timing the run from outside.


class Phases:
    """Exclusive seconds per phase: each wrapped function's time, less that of the wrapped calls inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack: list[list] = []

    def reset(self) -> None:
        self.seconds, self.stack = {}, []

    def wrap(self, owner: object, attribute: str, phase: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self.stack.append([time.perf_counter(), 0.0])
            try:
                return original(*args, **kwargs)
            finally:
                began, inner = self.stack.pop()
                spent = time.perf_counter() - began
                self.seconds[phase] = self.seconds.get(phase, 0.0) + spent - inner
                if self.stack:
                    self.stack[-1][1] += spent

        setattr(owner, attribute, timed)


def instrument(phases: Phases, ray: bool) -> None:
    """Time the steps of `dscore variants` (the module's own names, looked up when the run calls them; the model's
    run is `execute` or `run` of `pipeline.runner` for the marginals, by the package's version, and `score` for pll)."""
    from distributed_scoring.workflows.variants import run as module

    steps = (
        ("_read_assay", "read"),
        ("sequences", "plan"),
        ("_digest", "plan"),
        ("_site_tables", "read_back"),  # what is left of it once the model's run and Ray's start are taken out
        ("_plls", "read_back"),
        ("execute", "run"),
        ("run", "run"),
        ("score", "run"),
        ("variant_scores", "join"),
        ("_summary", "statistics"),
        ("_write", "write"),
    )
    found = {attribute for attribute, _ in steps if callable(getattr(module, attribute, None))}
    missing = {"_read_assay", "sequences", "_site_tables", "_plls", "score", "variant_scores", "_summary", "_write"}
    missing -= found
    if missing or not found & {"execute", "run"}:
        raise SystemExit(f"{module.__name__} has no {sorted(missing) or 'execute or run'}: update instrument()")
    for attribute, phase in steps:
        if attribute in found:
            phases.wrap(module, attribute, phase)
    if ray:
        import ray as ray_module

        phases.wrap(ray_module, "init", "ray_start")
        phases.wrap(ray_module, "shutdown", "ray_stop")


def run_once(
    strategy: str, mode: str, table: Path, target: str, model: str, out: Path, args: argparse.Namespace, phases: Phases
) -> dict:
    """One `dscore variants` run through the CLI: its summary, wall seconds and phases, the load around it."""
    from distributed_scoring.cli import main

    argv = ["variants", str(table), "--model", model, "--target-seq", target, "--strategy", strategy]
    argv += ["--output", str(out), "--overwrite"]
    if mode == "ray":
        argv += ["--ray", "--num-actors", str(args.num_actors)]
    if args.batch_tokens:
        argv += ["--batch-tokens", str(args.batch_tokens)]
    load_before = load_average()
    print(f"[{time.strftime('%H:%M:%S')}] {strategy} {mode} ({table.name}), load {load_before}", file=sys.stderr)
    phases.reset()
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    seconds = time.perf_counter() - began
    if rc != 0:
        raise SystemExit(f"dscore {' '.join(argv)} exited {rc}")
    import torch

    summary = json.loads((out / "summary.json").read_text())
    measured = {p: round(phases.seconds.get(p, 0.0), 3) for p in PHASES if p != "other"}
    measured["other"] = round(seconds - sum(measured.values()), 3)
    return {
        "strategy": strategy,
        "mode": mode,
        "variants": summary["variants"],
        "ok": summary["ok"],
        "forward_passes": summary["forward_passes"],
        "seconds": round(seconds, 3),
        "summary_seconds": summary["seconds"],
        "variants_per_s": round(summary["variants"] / seconds, 2),
        "passes_per_s_of_run": round(summary["forward_passes"] / measured["run"], 2) if measured["run"] else None,
        "phases": measured,
        "torch_threads": torch.get_num_threads() if mode == "in-process" else None,
        "load_before": load_before,
        "load_after": load_average(),
    }


def scores(out: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    table = pq.read_table(out / "variants.parquet", columns=["mutant", "score"])
    return dict(zip(table["mutant"].to_pylist(), table["score"].to_pylist()))


def extrapolated(run: dict, variants: int, passes: int, whole: dict | None) -> tuple[float, str]:
    """The seconds of the full table from a sample's run, and where its driver's share came from: the full table's
    forward passes at the passes/s of the sample's model run, plus the driver's phases (read, plan, join,
    statistics, write) of `whole`, a run of the same mode over the full table (a marginal's: the same rows read,
    joined, summarised and written), or else the sample's scaled by the variants, plus Ray's start and stop and the
    rest (`other`) as the sample measured them."""
    phases = run["phases"]
    if whole is not None:
        driver, source = (
            sum(whole["phases"][p] for p in DRIVER_PHASES),
            f"the {whole['strategy']} run of the whole table",
        )
    else:
        driver = sum(phases[p] for p in DRIVER_PHASES) * variants / run["variants"]
        source = "the sample, scaled by the variants"
    fixed = phases["ray_start"] + phases["ray_stop"] + phases["other"]
    return passes / run["passes_per_s_of_run"] + driver + fixed, source


# Reporting.


def markdown(results: dict) -> str:
    machine, setup = results["machine"], results["setup"]
    threads = next((r["torch_threads"] for r in results["runs"] if r["torch_threads"]), None)
    read = "the whole wild type" if setup["fits"] else f"{setup['window']} residues: the wild type is read in windows"
    lines = [
        f"{machine['cpu']}, {machine['logical_cores']} logical cores, torch {machine['versions']['torch']}"
        + (f", {threads} torch thread(s) in-process" if threads else "")
        + f"; Ray embedded, {setup['num_actors']} scoring actor(s). Model {setup['model_name']} (window "
        f"{setup['max_length']} tokens, {read}); wild type {setup['length']} residues; seed {setup['seed']}; "
        f"{results['date']}.",
        "",
        "| strategy | variants | forward passes | in-process s | Ray s | variants/s (in-process / Ray) | "
        "load average (1 min, before in-process / Ray) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in results["full_scale"]:
        mark = "" if row["measured"] else " †"
        s = {m: row["seconds"].get(m) for m in MODES}
        rate = {m: row["variants"] / v if v else None for m, v in s.items()}
        load = {m: row["load_before"].get(m) for m in MODES}
        lines.append(
            f"| {row['strategy']} | {row['variants']:,} | {row['forward_passes']:,} | "
            + " | ".join("–" if s[m] is None else f"{'≈ ' * (not row['measured'])}{s[m]:,.1f}{mark}" for m in MODES)
            + " | "
            + " / ".join("–" if rate[m] is None else f"{rate[m]:,.1f}" for m in MODES)
            + " | "
            + " / ".join("–" if load[m] is None else f"{load[m]:.2f}" for m in MODES)
            + " |"
        )
    sampled = [r for r in results["full_scale"] if not r["measured"]]
    if sampled:
        lines += [
            "",
            "† Extrapolated, not measured: "
            + "; ".join(f"{r['strategy']} from a sample of {r['sample']:,} variants" for r in sampled)
            + " (below). The forward passes are exact (the plan of the whole table); the seconds are those passes at "
            "the sample's measured passes/s of its model run (model load and, on Ray, the actor's start included), "
            "plus the driver's phases (read + parse, plan, read back + join, statistics, write) of "
            + "; ".join(sorted({src for r in sampled for src in r.get("driver_phases_from", {}).values()}))
            + " in the same mode, plus the sample's Ray start + stop and `other`.",
        ]
    agreed = [r["max_score_difference_ray_in_process"] for r in results["full_scale"] if len(r["seconds"]) == 2]
    if agreed:
        lines += ["", f"Every variant's score on Ray is its in-process score (largest difference {max(agreed):.1e})."]
    lines += [
        "",
        "The runs measured, and where their seconds went (exclusive, s):",
        "",
        "| strategy | mode | variants | forward passes | s | passes/s (model run) | read + parse | plan | "
        "Ray start + stop | model run | read back + join | statistics | write | other | load before → after |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results["runs"]:
        p = r["phases"]
        lines.append(
            f"| {r['strategy']} | {r['mode']} | {r['variants']:,} | {r['forward_passes']:,} | {r['seconds']:,.1f} | "
            f"{r['passes_per_s_of_run'] or 0:,.0f} | {p['read']:.1f} | {p['plan']:.1f} | "
            f"{p['ray_start'] + p['ray_stop']:.1f} | {p['run']:.1f} | {p['read_back'] + p['join']:.1f} | "
            f"{p['statistics']:.1f} | {p['write']:.1f} | {p['other']:.1f} | "
            f"{r['load_before']:.2f} → {r['load_after']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def parse_sample(values: list[str]) -> dict[str, int]:
    sample = dict(DEFAULT_SAMPLE)
    for value in values:
        strategy, _, n = value.partition("=")
        if strategy not in STRATEGIES or not n.isdigit():
            raise SystemExit(f"--sample {value!r}: give STRATEGY=N, STRATEGY one of {', '.join(STRATEGIES)}")
        sample[strategy] = int(n)
    return sample


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=int, default=100_000, help="distinct variants in the table (10^5)")
    parser.add_argument("--length", type=int, default=300, help="residues of the wild type (300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="sapiens-vh", help="an offline model's name (fetch_model) or a folder")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--sample",
        nargs="*",
        default=[],
        metavar="STRATEGY=N",
        help="score a seeded sample of N variants for STRATEGY and extrapolate the full table's seconds (default "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_SAMPLE.items())
        + "; a strategy's N of 0 or at least --variants runs the whole table)",
    )
    parser.add_argument("--no-warm-up", action="store_true", help="skip the untimed run of 20 variants per mode")
    parser.add_argument("--num-actors", type=int, default=1, help="scoring actors on Ray (1 on 2 cores)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="the model's token budget (package default)")
    parser.add_argument("--output", type=Path, default=None, help="tables and runs go here (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--update-results", type=Path, default=None, metavar="RESULTS.md", help="rewrite its table")
    args = parser.parse_args()
    sample = parse_sample(args.sample)

    from distributed_scoring.cpus import thread_env

    # What `dscore` sets before torch starts (OpenMP reads it once): the passive wait policy. Torch is imported
    # here, before the first run, so without it the in-process runs would spin, unlike the CLI's.
    os.environ.update(thread_env())
    import distributed_scoring
    import distributed_scoring.engine.masked_lm  # noqa: F401  torch and transformers imported before any timing
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.engine.model_files import load_tokenizer
    from distributed_scoring.offline.models import MODELS, fetch_model
    from distributed_scoring.workloads.variants import residue_vocabulary

    import machine

    model = str(fetch_model(args.model)) if args.model in MODELS else args.model
    print(f"package: {Path(distributed_scoring.__file__).parent}; model: {model}", file=sys.stderr)
    if load_average() > 0.5:
        print(f"load average {load_average()} before the start: the timings will be disturbed", file=sys.stderr)
    phases = Phases()
    instrument(phases, "ray" in args.modes)

    target = wild_type(args.length, args.seed)
    tokenizer, max_length = load_tokenizer(ModelSpec(model))
    vocabulary = residue_vocabulary(tokenizer, model, "masked-marginal", target)
    window = Window(max_length, len(vocabulary.prefix), len(vocabulary.suffix), args.length)
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "package": str(Path(distributed_scoring.__file__).parent),
        "machine": machine.describe(),
        "setup": {
            "model": model,
            "model_name": args.model,
            "max_length": max_length,
            "window": window.width,
            "fits": window.fits,
            "length": args.length,
            "variants": args.variants,
            "seed": args.seed,
            "sample": {s: sample.get(s) for s in args.strategies},
            "num_actors": args.num_actors,
            "batch_tokens": args.batch_tokens,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "wild_type": target,
        },
        "runs": [],
        "full_scale": [],
    }
    with tempfile.TemporaryDirectory() as name:
        folder = args.output or Path(name)
        folder.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        names = variant_names(target, args.variants, args.seed)
        full = folder / f"dms-{args.variants}.csv"
        write_table(full, target, names, args.seed)
        singles = sum(":" not in n for n in names)
        print(
            f"table {full}: {len(names):,} variants ({singles:,} single) in {time.perf_counter() - began:.1f} s",
            file=sys.stderr,
        )
        if not args.no_warm_up:  # imports, the model's files, matplotlib, Ray's first start: not in any figure
            warm = folder / "dms-warm-up.csv"
            write_table(warm, target, names[:20], args.seed)
            began = time.perf_counter()
            for mode in args.modes:
                run_once("wt-marginal", mode, warm, target, model, folder / f"run-warm-up-{mode}", args, phases)
            results["warm_up_seconds"] = round(time.perf_counter() - began, 1)
        for strategy in args.strategies:
            n = sample.get(strategy, 0)
            subset = names
            table = full
            if 0 < n < len(names):
                rows = sorted(random.Random(args.seed + 3).sample(range(len(names)), n))
                subset = [names[i] for i in rows]
                table = folder / f"dms-{strategy}-{n}.csv"
                write_table(table, target, subset, args.seed)
            expected = expected_passes(strategy, target, subset, window)
            full_passes = expected_passes(strategy, target, names, window) if subset is not names else expected
            row = {
                "strategy": strategy,
                "variants": len(names),
                "forward_passes": full_passes,
                "measured": subset is names,
                "sample": len(subset),
                "seconds": {},
                "load_before": {},
            }
            outputs = {}
            for mode in args.modes:
                out = folder / f"run-{strategy}-{mode}"
                run = run_once(strategy, mode, table, target, model, out, args, phases)
                run["expected_passes"] = expected
                print(json.dumps(run), file=sys.stderr)
                results["runs"].append(run)
                if run["forward_passes"] != expected:
                    raise SystemExit(
                        f"{strategy} {mode}: {run['forward_passes']} forward passes, the plan says {expected}"
                    )
                if run["ok"] != len(subset) or run["variants"] != len(subset):
                    raise SystemExit(f"{strategy} {mode}: {run['ok']} of {len(subset)} variants scored")
                outputs[mode] = scores(out)
                row["seconds"][mode] = run["seconds"]  # a sample's, replaced by the extrapolation below
                row["load_before"][mode] = run["load_before"]
            if len(outputs) == 2:
                a, b = outputs.values()
                worst = max(abs(a[k] - b[k]) for k in a)
                row["max_score_difference_ray_in_process"] = worst
                if a.keys() != b.keys() or worst > SCORE_TOLERANCE:
                    raise SystemExit(f"{strategy}: in-process and Ray scores differ by {worst:.2e}")
            results["full_scale"].append(row)
    for row in results["full_scale"]:  # the samples' extrapolations, once every run of the whole table is in
        if row["measured"]:
            continue
        for mode in row["seconds"]:
            run = next(r for r in results["runs"] if r["strategy"] == row["strategy"] and r["mode"] == mode)
            whole = next((r for r in results["runs"] if r["mode"] == mode and r["variants"] == row["variants"]), None)
            seconds, source = extrapolated(run, row["variants"], row["forward_passes"], whole)
            row["seconds"][mode] = round(seconds, 1)
            row.setdefault("driver_phases_from", {})[mode] = source
    table_md = markdown(results)
    print(table_md)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.update_results:
        from results_md import update_section

        update_section(args.update_results, "variants", table_md, "benchmarks/variants.py")


if __name__ == "__main__":
    main_()
