"""Sentences per second of the maskless scorers (`engine.maskless`) against the PLL engine, same sentences,
same machine.

    python benchmarks/maskless_speed.py [--student DIR ...] [--update-results benchmarks/RESULTS.md]

The PLL of a sentence of n scored tokens is n masked copies through the encoder and the LM head at each
masked position. A `sentence` student (Salazar et al., 2020, sec. 2.2) reads the sentence once and maps the
first token's hidden state to a number; `unmasked` and the `token`/`distribution` students read it once and
apply the LM head at its n scored positions. All run the same AntiBERTy encoder (real weights) on the same
IMGT germline heavy V genes, packed under the same token budget, in float32 on the CPU with the same torch
threads; tokenisation and model loading are not timed, a warm-up call runs first, rounds interleave the
methods and the median is reported. A scorer's speed does not depend on its trained values, so without
--student an untrained sentence head is timed beside `unmasked` (which times every per-token student);
each --student (an --output of `dscore train maskless` on AntiBERTy) is timed as trained. The load average
at the start is recorded: time on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.maskless import (
    MasklessEngine,
    load_student,
    regressor_for,
    save_student,
    unmasked_scorer,
)
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.offline.models import fetch_model
from distributed_scoring.workloads.prepare import PLLPreparer

import machine
import results_md

HERE = Path(__file__).resolve().parent


def sentences(mlm, count: int) -> list[Sentence]:
    chains = [spaced(chain) for _, chain in sorted(v_genes("human").items())[:count]]
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(chains)
    return [Sentence(np.asarray(p.input_ids), np.asarray(p.targets), np.asarray(p.piece_words)) for p in prepared]


def markdown(rows: list[dict], result: dict) -> str:
    lines = [
        f"{result['machine']['cpu']}, {result['threads']} torch thread(s), load average {result['load']:.1f} "
        f"at the start; median of {result['rounds']} rounds.",
        "",
        "| model | sentences | tokens (mean) | budget | method | s | sentences/s | speed-up |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['sentences']} | {r['tokens']:.1f} | {r['budget']} | {r['method']} | "
            f"{r['seconds']:.3f} | {r['sentences_per_s']:.2f} | {r['speedup']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--student", type=Path, action="append", default=[], help="a trained student folder of AntiBERTy (repeatable)"
    )
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budgets", default="1024,4096", help="token budgets of a forward pass")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--update-results", type=Path, help="also write the table into this RESULTS.md")
    args = parser.parse_args()
    load = machine.start(args.threads)
    model = str(fetch_model("antiberty"))
    mlm = load_masked_lm(ModelSpec(model))
    batch = sentences(mlm, args.chains)
    scorers = {"unmasked": unmasked_scorer(ModelSpec(model))}
    with tempfile.TemporaryDirectory() as folder:
        if not args.student:
            save_student(mlm, folder, {"target": "sentence", "teacher": None}, regressor_for(mlm, -100.0, 10.0))
            scorers["sentence student (untrained head)"] = load_student(ModelSpec(folder))
        for path in args.student:
            student = load_student(ModelSpec(str(path)))
            scorers[f"{student.info['target']} student ({path.name})"] = student
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        methods = {
            "PLL engine": lambda budget=budget: PLLEngine(mlm, "original", budget).token_logprobs(batch),
            **{
                name: (lambda s=s, budget=budget: MasklessEngine(s, budget).predict(batch))
                for name, s in scorers.items()
            },
        }
        for run in methods.values():
            run()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(args.rounds):
            for name, run in methods.items():
                times[name].append(machine.timed(run)[0])
        pll = statistics.median(times["PLL engine"])
        for name, rounds in times.items():
            seconds = statistics.median(rounds)
            rows.append(
                {
                    "model": "AntiBERTy",
                    "budget": budget,
                    "sentences": len(batch),
                    "tokens": float(np.mean([len(s.input_ids) for s in batch])),
                    "method": name,
                    "seconds": seconds,
                    "rounds": rounds,
                    "sentences_per_s": len(batch) / seconds,
                    "speedup": pll / seconds,
                }
            )
    result = {"machine": machine.describe(), "threads": args.threads, "rounds": args.rounds, "load": load, "rows": rows}
    table = markdown(rows, result)
    results_md.save_raw("maskless-speed", result)
    (args.out / "maskless-speed.md").write_text(table)
    if args.update_results:
        results_md.update_section(args.update_results, "maskless-speed", table, "benchmarks/maskless_speed.py")
    print(table)


if __name__ == "__main__":
    main()
