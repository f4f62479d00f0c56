"""Examples per second of the pairwise-joints computation (conditionals + five constructions + metrics).

    python benchmarks/joints_speed.py [--update-results benchmarks/RESULTS.md]

One example needs 2|V| masked passes of its sentence, so the vocabulary size decides the cost. Measured
on the scoring core in this process (model loading excluded, a warm-up example first): AntiBERTy (real
weights, V = 25) on germline heavy chains cut to 30 residues and at full length (about 100) and a tiny
BERT (2 layers, hidden 64, a 1,000-piece WordPiece vocabulary, random weights), exact over V; and a small
BERT shape (4 layers, hidden 256, V = 30,522) with the top-50 candidate approximation, since exact
tables over 30k tokens need about 30 GB (more than this machine has).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import numpy as np

import machine
import results_md
import synthetic
from scaling import small_bert


def examples_per_second(
    model_dir: str, texts: list[str], seed: int, rounds: int, top_k: int | None
) -> tuple[list[float], int, float]:
    """(seconds of each round, vocabulary size, mean tokens per sentence) over `texts`, random pairs."""
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.engine.conditionals import ConditionalsEngine, Pair
    from distributed_scoring.engine.joints import score_pair
    from distributed_scoring.engine.masked_lm import load_masked_lm
    from distributed_scoring.workloads.joints import draw_pair
    from distributed_scoring.workloads.prepare import PLLPreparer

    mlm = load_masked_lm(ModelSpec(model_dir))
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts)
    rng = random.Random(seed)
    pairs = [
        Pair(np.array(p.input_ids), np.array(p.targets), *draw_pair(len(p.targets), "random", rng)) for p in prepared
    ]
    engine = ConditionalsEngine(mlm, top_k=top_k)

    def run(batch: list) -> None:
        for _, cond in engine.conditionals(batch):
            score_pair(cond)

    run(pairs[:1])  # warm-up
    times = [machine.timed(lambda: run(pairs))[0] for _ in range(rounds)]
    length = float(np.mean([len(p.input_ids) for p in prepared]))
    return times, int(mlm.model.config.vocab_size), length


def tiny_bert(root: Path) -> Path:
    """A saved random BERT of 2 layers, hidden 64, with a 1,000-piece WordPiece vocabulary."""
    return synthetic.small_bert_folder(root, "bert-tiny", 1000, hidden=64, layers=2, heads=2, ffn=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models-dir", default=None, help="where the random model is saved (default: ~/.cache)")
    parser.add_argument("--update-results", default=None)
    args = parser.parse_args()

    from distributed_scoring.offline.antibodies import spaced, v_genes
    from distributed_scoring.offline.models import cache_root, fetch_model

    genes = random.Random(0).sample(sorted(v_genes("human").values()), 8)
    antiberty = str(fetch_model("antiberty"))
    models = Path(args.models_dir) if args.models_dir else cache_root() / "bench-models"
    bert_small, bert_tiny = str(small_bert(models)), str(tiny_bert(models))
    blimp = synthetic.sentences(8, "blimp", seed=5)
    blocks = [
        ("AntiBERTy", "germline VH, 30 residues", antiberty, [spaced(g[:30]) for g in genes], None),
        ("AntiBERTy", "germline VH, full", antiberty, [spaced(g) for g in genes[:4]], None),
        ("tiny BERT 2x64 (random)", "BLiMP-like", bert_tiny, blimp[:4], None),
        ("BERT 4x256 (random)", "BLiMP-like", bert_small, blimp, 50),
    ]
    info = machine.describe()
    lines = [
        f"{info['cpu']}, {info['logical_cores']} logical cores, torch threads {info['torch_threads']}; python "
        f"{info['python']}, torch {info['versions']['torch']}, transformers {info['versions']['transformers']}.",
        f"Median of {args.rounds} rounds after a warm-up; the vocabulary column says which values each table covers.",
        "",
        "| model | sentences | V | vocabulary | tokens/sentence | examples | examples/s | 1000 examples take |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    raw: dict = {"machine": info, "blocks": []}
    for model, what, folder, texts, top_k in blocks:
        times, vocab, length = examples_per_second(folder, texts, seed=1, rounds=args.rounds, top_k=top_k)
        rate = len(texts) / statistics.median(times)
        raw["blocks"].append(
            {
                "model": model,
                "sentences": what,
                "vocab_size": vocab,
                "top_k": top_k,
                "examples": len(texts),
                "mean_tokens": length,
                "seconds": times,
            }
        )
        support = "all of V" if top_k is None else f"gold + top-{top_k}"
        lines.append(
            f"| {model} | {what} | {vocab} | {support} | {length:.0f} | {len(texts)} | {rate:.3g} | "
            f"{1000 / rate / 3600:.2g} h |"
        )
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    print(table)
    results_md.save_raw("joints-speed", raw)
    if args.update_results:
        results_md.update_section(Path(args.update_results), "joints-speed", table, "benchmarks/joints_speed.py")


if __name__ == "__main__":
    main()
