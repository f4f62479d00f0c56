"""Scaling of the Ray pipeline with the number of CPU scoring actors, and its overhead over in-process scoring.

    python benchmarks/scaling.py [--sentences 600,2400] [--rounds 2] [--update-results benchmarks/RESULTS.md]

The same synthetic corpus (BLiMP-like lengths) is scored end to end by `dscore score`'s two executions:
in this process, and through the Ray Data pipeline (read tasks -> tokenising actor -> scoring actors ->
write tasks -> driver aggregation) with 1, 2, ... CPU actors on one local Ray that declares two CPUs
beyond the machine's cores, as the embedded Ray does. Every run starts from an empty output folder and
includes loading the model (once in-process, once per actor on Ray); Ray's own start-up is excluded
(it happens once, before the timed runs). The model is a small BERT shape (4 layers, hidden 256,
WordPiece vocabulary 30,522, random weights) so that a CPU run takes seconds, not hours.
The scores of every configuration are checked against the in-process ones before any rate is printed.
Two corpus sizes show how the pipeline's fixed costs (actor processes, model loads) amortise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

import machine
import results_md
import synthetic


def small_bert(root: Path) -> Path:
    """A saved random BERT of 4 layers, hidden 256, with the benchmark's 30,522-piece tokenizer."""
    return synthetic.small_bert_folder(root, "bert-small", 30522, hidden=256, layers=4, heads=4, ffn=1024)


def run_once(corpus: Path, model: Path, out: Path, ray_options) -> tuple[float, dict]:
    from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
    from distributed_scoring.workflows.score import score

    shutil.rmtree(out, ignore_errors=True)
    config = RunConfig(InputSpec((str(corpus),), shard_rows=50), ModelSpec(str(model)), output=str(out))
    seconds, summary = machine.timed(lambda: score(config, ray_options, progress=False))
    return seconds, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", default="600,2400", help="comma-separated corpus sizes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--actors", default="1,2", help="comma-separated numbers of CPU scoring actors")
    parser.add_argument("--models-dir", default=None, help="where the random model is saved (default: a temp dir)")
    parser.add_argument("--update-results", default=None, help="also write the table into this RESULTS.md")
    args = parser.parse_args()

    import ray

    from distributed_scoring.config import RayOptions
    from distributed_scoring.pipeline.cluster import LOCAL_SPARE_CPUS

    work = Path(tempfile.mkdtemp(prefix="dscore-scaling-"))
    model = small_bert(Path(args.models_dir) if args.models_dir else work)
    cores = os.cpu_count() or 1
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=cores + LOCAL_SPARE_CPUS, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    configs = [("in-process", None)] + [
        (
            f"ray, {n} actor{'s' * (n > 1)} x {max(1, cores // n)} CPU",
            RayOptions(num_actors=n, cpus_per_actor=max(1, cores // n)),
        )
        for n in map(int, args.actors.split(","))
    ]
    lines = [
        f"{machine.cpu_name()}, {cores} cores; median of {args.rounds} rounds, model load included, "
        "Ray start-up excluded.",
        "",
        "| sentences | scored tokens | execution | seconds | sentences/s | tokens/s | time vs in-process |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    raw: dict = {"machine": machine.describe(), "runs": []}
    for size in map(int, args.sentences.split(",")):
        corpus = work / f"corpus-{size}.txt"
        corpus.write_text("\n".join(synthetic.sentences(size, "blimp", seed=11)) + "\n")
        results, reference = {}, None
        for _ in range(args.rounds):
            for name, options in configs:
                seconds, summary = run_once(corpus, model, work / "out", options)
                rows = {
                    r["id"]: r["pll"] for r in pq.read_table(work / "out" / "rows", columns=["id", "pll"]).to_pylist()
                }
                reference = reference or rows
                worst = max(abs(rows[k] - reference[k]) for k in reference if reference[k] is not None)
                assert rows.keys() == reference.keys() and worst < 1e-4, f"{name}: scores differ by {worst}"
                results.setdefault(name, []).append(seconds)
        tokens = summary["n_tokens"]
        base = statistics.median(results["in-process"])
        for name, times in results.items():
            median = statistics.median(times)
            lines.append(
                f"| {size} | {tokens} | {name} | {median:.1f} | {size / median:.1f} | {tokens / median:.0f} | "
                f"{median / base:.2f}x |"
            )
        raw["runs"].append({"sentences": size, "tokens": tokens, "seconds": results})
    ray.shutdown()
    table = "\n".join(lines) + "\n"
    print(table)
    results_md.save_raw("scaling", raw)
    if args.update_results:
        results_md.update_section(Path(args.update_results), "scaling", table, "benchmarks/scaling.py")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
