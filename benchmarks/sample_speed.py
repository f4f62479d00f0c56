"""Proposals per second of Metropolis-Hastings sampling (`engine.sampler`) against a naive loop.

    python benchmarks/sample_speed.py [--update-results benchmarks/RESULTS.md]

The naive loop is what the method costs written plainly: one chain and one proposal at a time, a forward
pass for the proposal, then both energies computed from scratch (every masked copy of the current and of
the proposed sequence, each sequence's copies in packed batches), the acceptance test, repeat. The
engine runs all chains in lockstep (one packed pass for every chain's proposal, one for the energies of
every changed proposal) and never recomputes a known energy (the current state's is kept), which alone
halves the energy work. Both use the same model object, the `mh` sampler on E_raw at T = 1 with the
same shaped proposal; model loading is excluded and a warm-up epoch runs first. Models: AntiBERTy (real
weights) on germline heavy chains cut to `--residues` residues with the last 6 sampled, and a random
2-layer BERT (hidden 64, V = 1,000) on short synthetic sentences with 4 positions sampled.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import numpy as np
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.energy import EnergyEngine, sequence_positions
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.sampler import Chain, Sampler, shaped_log_proposal
from distributed_scoring.engine.sampler_settings import SamplerSettings
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.offline.models import cache_root, fetch_model
from distributed_scoring.workloads.infill import allowed_tokens

import machine
import results_md
import synthetic

HERE = Path(__file__).resolve().parent


def naive_proposals(mlm, allowed: np.ndarray, chains: list[Chain], epochs: int) -> int:
    """The plain loop (see the module docstring); returns the number of proposals made."""
    engine = EnergyEngine(mlm)
    allowed_ids = torch.as_tensor(np.flatnonzero(allowed))
    index = np.full(len(allowed), -1)
    index[np.flatnonzero(allowed)] = np.arange(int(allowed.sum()))
    proposals = 0
    for chain in chains:
        rng = np.random.default_rng(chain.seed)
        ids = chain.input_ids.copy()
        for _ in range(epochs):
            for position in chain.sample.tolist():
                masked = ids.copy()
                masked[position] = mlm.mask_token_id
                logits = next(
                    mlm.logits_at(masked[None], np.ones((1, len(ids)), dtype=np.int64), np.array([position]))
                )  # (1, V)
                logq = shaped_log_proposal(logits, allowed_ids, 1.0, 1.0)[0].numpy()  # (C,)
                pick = int(np.searchsorted(np.cumsum(np.exp(logq)), rng.random(), side="right"))
                pick = min(pick, len(logq) - 1)
                new = ids.copy()
                new[position] = int(allowed_ids[pick])
                current_raw = engine.energies([ids], [chain.scored])[0][0]
                new_raw = engine.energies([new], [chain.scored])[0][0]
                log_a = min(0.0, -(new_raw - current_raw) + logq[index[ids[position]]] - logq[pick])
                if rng.random() < math.exp(log_a):
                    ids = new
                proposals += 1
    return proposals


def block(name: str, mlm, allowed: np.ndarray, chains: list[Chain], epochs: int, rounds: int) -> list[dict]:
    settings = SamplerSettings("mh", "raw", epochs=epochs, start="given")
    methods = {
        "naive loop": lambda: naive_proposals(mlm, allowed, chains, epochs),
        "engine, no cache": lambda: _engine(mlm, allowed, chains, settings, cache=0),
        "engine": lambda: _engine(mlm, allowed, chains, settings, cache=1 << 16),
    }
    warm = SamplerSettings("mh", "raw", epochs=1, start="given")
    _engine(mlm, allowed, chains[:1], warm, cache=0)
    rows = []
    for method, fn in methods.items():
        seconds, proposals = [], 0
        for _ in range(rounds):
            took, proposals = machine.timed(fn)
            seconds.append(took)
        median = statistics.median(seconds)
        rows.append(
            {
                "model": name,
                "chains": len(chains),
                "length": len(chains[0].input_ids),
                "sampled": len(chains[0].sample),
                "method": method,
                "proposals": proposals,
                "seconds": seconds,
                "proposals_per_s": proposals / median,
            }
        )
    base = rows[0]["proposals_per_s"]
    for row in rows:
        row["speedup"] = row["proposals_per_s"] / base
    return rows


def _engine(mlm, allowed, chains, settings, cache: int) -> int:
    records = Sampler(mlm, allowed, cache_states=cache).run(chains, settings)
    return sum(r.proposals for recs in records for r in recs)


def antiberty_chains(mlm, count: int, residues: int, sampled: int) -> list[Chain]:
    chains = []
    for seed, (_, chain) in enumerate(sorted(v_genes("human").items())[:count]):
        ids = np.array(mlm.tokenizer(spaced(chain[:residues]))["input_ids"], dtype=np.int64)
        scored = sequence_positions(mlm, ids)
        chains.append(Chain(ids, scored[-sampled:], scored, seed))
    return chains


def sentence_chains(mlm, count: int, sampled: int) -> list[Chain]:
    chains = []
    for seed, text in enumerate(synthetic.sentences(count, "blimp", seed=3)):
        ids = np.array(mlm.tokenizer(text)["input_ids"], dtype=np.int64)
        scored = sequence_positions(mlm, ids)
        chains.append(Chain(ids, scored[:sampled], scored, seed))
    return chains


def markdown(rows: list[dict], result: dict) -> str:
    lines = [
        f"{result['machine']['cpu']}, {result['threads']} torch thread(s); median of {result['rounds']} rounds; "
        "`mh` on E_raw, T = 1, every proposal counted.",
        "",
        "| model | chains | tokens | sampled | method | proposals | proposals/s | vs naive |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['chains']} | {r['length']} | {r['sampled']} | {r['method']} | "
            f"{r['proposals']} | {r['proposals_per_s']:.2f} | {r['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--residues", type=int, default=24, help="AntiBERTy chains cut to this many residues")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models-dir", type=Path, default=cache_root() / "benchmarks" / "models")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--update-results", type=Path, help="also write the table into this RESULTS.md")
    args = parser.parse_args()
    machine.start(args.threads)
    rows = []
    antiberty = load_masked_lm(ModelSpec(str(fetch_model("antiberty"))))
    allowed = allowed_tokens(antiberty.tokenizer, antiberty.model.config.vocab_size, tuple("ACDEFGHIKLMNPQRSTVWY"))
    rows += block(
        "AntiBERTy",
        antiberty,
        allowed,
        antiberty_chains(antiberty, args.chains, args.residues, 6),
        args.epochs,
        args.rounds,
    )
    folder = synthetic.small_bert_folder(args.models_dir, "bert-tiny", 1000, hidden=64, layers=2, heads=2, ffn=128)
    tiny = load_masked_lm(ModelSpec(str(folder)))
    allowed = allowed_tokens(tiny.tokenizer, tiny.model.config.vocab_size, None)
    rows += block(
        "BERT 2x64 (random), V = 1,000", tiny, allowed, sentence_chains(tiny, args.chains, 4), args.epochs, args.rounds
    )
    result = {"machine": machine.describe(), "threads": args.threads, "rounds": args.rounds, "rows": rows}
    table = markdown(rows, result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sample-speed.md").write_text(table)
    if args.update_results:
        results_md.update_section(args.update_results, "sample-speed", table, "benchmarks/sample_speed.py")
    print(table)


if __name__ == "__main__":
    main()
