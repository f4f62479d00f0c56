"""Training demo on real weights, sized for a 2-core CPU: AntiBERTy distilled into a maskless scorer, and a
short u-PMLM fine-tune.

1. Teacher: AntiBERTy's PLLs of IMGT germline V genes (human and mouse heavy, kappa and lambda chains),
   scored by our own PLL engine (`dscore score`).
2. `dscore train maskless` on those PLLs: held-out Pearson/Spearman with the teacher, and the speed-up
   over the PLL engine on this machine.
3. Rescoring error with the teacher and with the student (`dscore rescore --model` vs `--maskless`) on a
   small N-best list built from held-out chains (`write_nbest`): WER over residues.
4. `dscore train pmlm`: a short u-PMLM fine-tune on the training chains, held-out chain-rule perplexity
   (left to right and in a random order) before and after.

Every step is a resumable `dscore` command into a folder under --output: a rerun skips what is done.

    python jobs/train_demo.py --output out/train-demo [--chains 240] [--epochs 8] [--pmlm-steps 60]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import pyarrow.parquet as pq

from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.offline.models import fetch_model

SPECIES = ("human", "mouse")
CHAINS = ("H", "K", "L")
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PARENT_SEPARATOR = "~"


def write_corpus(path: Path, parents: int, mutants: int, seed: int) -> Path:
    """A distillation corpus: `parents` germline V genes drawn with `seed` from the distinct genes of
    SPECIES x CHAINS (id species:chain:gene), each followed by `mutants` point mutants with 1 to 3 random
    residue substitutions (id <parent id>~m<j>: `--parent-separator ~`). One JSONL row each, residues
    space-separated; families in random order, so that any prefix of the file holds whole families.
    The file is rewritten only when its content would change (the teacher run's input stays as it was)."""
    genes = [(f"{s}:{c}:{name}", sequence) for s in SPECIES for c in CHAINS
             for name, sequence in sorted(v_genes(s, c).items())]
    unique = list({sequence: (name, sequence) for name, sequence in genes}.values())
    rng = random.Random(seed)
    rows = []
    for name, parent in rng.sample(unique, min(parents, len(unique))):
        rows.append((name, parent))
        rows += [(f"{name}{PARENT_SEPARATOR}m{j}", mutated(parent, rng.randint(1, 3), rng)) for j in range(1, mutants + 1)]
    text = "".join(json.dumps({"id": name, "text": spaced(s)}) + "\n" for name, s in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def mutated(sequence: str, substitutions: int, rng: random.Random) -> str:
    """`sequence` with `substitutions` residues at distinct random positions replaced by other amino acids."""
    residues = list(sequence)
    for position in rng.sample(range(len(residues)), substitutions):
        residues[position] = rng.choice([a for a in AMINO_ACIDS if a != residues[position]])
    return "".join(residues)


def write_nbest(path: Path, chains: dict[str, str], n_best: int, seed: int) -> Path:
    """An N-best list per held-out chain: the chain itself and `n_best - 1` copies with 1 to 3 random
    residue substitutions, the "sequence model" score -(substitutions) + N(0, 1) noise, so its 1-best is
    often wrong and an LM that knows antibodies can repair the ranking (as tests/rescoring_helpers.py
    builds them). Texts are space-separated residues; WER counts wrong residues."""
    rng = random.Random(seed)
    records = []
    for name, truth in chains.items():
        residues = truth.split()
        hypotheses = {truth: 0}
        while len(hypotheses) < n_best:
            k = rng.randint(1, 3)
            changed = list(residues)
            for position in rng.sample(range(len(changed)), k):
                changed[position] = rng.choice([a for a in AMINO_ACIDS if a != changed[position]])
            hypotheses.setdefault(" ".join(changed), k)
        ranked = sorted(((-k + rng.gauss(0, 1), text) for text, k in hypotheses.items()), reverse=True)
        records += [{"utt_id": name, "hyp_id": rank, "text": text, "score": score, "ref": truth}
                    for rank, (score, text) in enumerate(ranked, start=1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(*args: str) -> dict:
    """A dscore command; its printed JSON result (stdout), or exit with its code."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = dscore(list(args))
    if code != 0:
        sys.exit(code)
    return json.loads(buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/train-demo", help="folder of every step's run")
    parser.add_argument("--chains", type=int, default=240, help="germline chains scored by the teacher")
    parser.add_argument("--epochs", type=int, default=8, help="maskless training epochs")
    parser.add_argument("--lr", type=float, default=1e-4, help="maskless peak learning rate (encoder)")
    parser.add_argument("--pmlm-steps", type=int, default=60, help="u-PMLM steps")
    parser.add_argument("--utterances", type=int, default=6, help="N-best utterances per split (dev, test)")
    parser.add_argument("--n-best", type=int, default=4, help="hypotheses per utterance")
    parser.add_argument("--cpus-per-worker", default="2", help="CPUs (torch threads) of the training worker")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    output = Path(args.output)
    model = str(fetch_model("antiberty"))
    corpus = write_corpus(output / "corpus.jsonl", args.chains, args.seed)
    common = ["--batch-size", "8", "--seed", str(args.seed), "--cpus-per-worker", args.cpus_per_worker]

    run("score", str(corpus), "--id-column", "id", "--model", model, "--output", str(output / "teacher"),
        "--shard-rows", "20")
    maskless = run("train", "maskless", "--teacher", str(output / "teacher"), "--model", model, "--output",
                   str(output / "maskless"), "--epochs", str(args.epochs), "--lr", str(args.lr), *common)

    heldout = pq.read_table(output / "maskless" / "data" / "heldout.parquet", columns=["id", "text"]).to_pylist()
    chains = {r["id"]: r["text"] for r in heldout[: 2 * args.utterances]}
    names = list(chains)
    splits = {split: write_nbest(output / f"nbest-{split}.jsonl", {n: chains[n] for n in part}, args.n_best, seed)
              for split, part, seed in (("dev", names[: args.utterances], 1), ("test", names[args.utterances:], 2))}
    rescored = {}
    for who, flag, scorer in (("teacher", "--model", model), ("student", "--maskless", str(output / "maskless"))):
        rescored[who] = run("rescore", "--dev", str(splits["dev"]), "--test", str(splits["test"]), flag, scorer,
                            "--output", str(output / f"rescore-{who}"), "--shard-rows", "20")

    pmlm = run("train", "pmlm", "--data", str(corpus), "--id-column", "id", "--model", model, "--output",
               str(output / "pmlm"), "--steps", str(args.pmlm_steps), *common)

    table = render(maskless, rescored, pmlm)
    (output / "summary.md").write_text(table)
    print("\n" + table)
    return 0


def render(maskless: dict, rescored: dict, pmlm: dict) -> str:
    h, s, t = maskless["heldout"], maskless["speed"], maskless["training"]
    before, after = pmlm["heldout"]["before"], pmlm["heldout"]["after"]
    lines = [
        f"## Maskless AntiBERTy ({maskless['rows']['train']} training chains, {t['steps']} steps; "
        f"{h['rows']} held-out chains)", "",
        "| | Pearson | Spearman | RMSE (nats) |", "|---|---:|---:|---:|",
        f"| student vs teacher PLL | {h['pearson']:.3f} | {h['spearman']:.3f} | {h['rmse']:.2f} |",
        f"| student vs teacher PLL per token | {h['pearson_per_token']:.3f} | {h['spearman_per_token']:.3f} | |",
        f"| length-only baseline (least squares on n_tokens) | {h['length_baseline']['pearson']:.3f} | | "
        f"{h['length_baseline']['rmse']:.2f} |", "",
        f"Teacher PLL std on the held-out chains: {h['teacher_std']:.2f} nats. Speed on this machine "
        f"({s['device']}, {s['threads']} threads, {s['sentences']} chains of {s['mean_tokens']:.0f} tokens): "
        f"student {s['student_sentences_per_s']:.2f} chains/s, PLL {s['pll_sentences_per_s']:.2f} chains/s, "
        f"speed-up {s['speedup']:.1f}x.", "",
        "## Rescoring (WER over residues, test split)", "",
        "| scorer | baseline | rescored | oracle | lambda |", "|---|---:|---:|---:|---:|",
        *[f"| {who} | {r['test']['baseline']:.4f} | {r['test']['rescored']:.4f} | {r['test']['oracle']:.4f} | "
          f"{r['lambda']:.2f} |" for who, r in rescored.items()], "",
        f"## u-PMLM fine-tune ({pmlm['training']['steps']} steps; {before['sentences']} held-out chains)", "",
        "| | PPL left to right | PPL random order |", "|---|---:|---:|",
        f"| AntiBERTy | {before['ppl_l2r']:.3f} | {before['ppl_random']:.3f} |",
        f"| after u-PMLM | {after['ppl_l2r']:.3f} | {after['ppl_random']:.3f} |",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
