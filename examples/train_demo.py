"""Training demo on real weights, sized for a 2-core CPU: AntiBERTy distilled into maskless scorers (every
target beside `unmasked`), and a short u-PMLM fine-tune.

1. A distillation corpus: IMGT germline V genes (human and mouse heavy, kappa and lambda chains) and two
   point mutants of each (1-3 substitutions), ids `<gene>~m<j>`.
2. Teacher: AntiBERTy's PLLs of it with each residue's term and its whole conditional (`dscore score
   --per-token --conditionals 25`: AntiBERTy's vocabulary has 25 tokens). It is the long step (about 1.5
   hours of 2 quiet cores for 1,800 chains) and is cached in --cache: a rerun costs nothing.
3. N-best lists built from held-out parents (the same split `dscore train maskless` makes with
   `--parent-separator ~`): each chain and copies with 1-3 random substitutions, a noisy "sequence model"
   score.
4. `dscore train maskless` once per --targets (sentence, token, distribution): held-out agreement with
   the teacher beside `unmasked` and the length-only baseline, mutant-minus-parent differences, rescoring
   with teacher, student and `unmasked`, and the speed-up over the PLL engine on this machine.
5. `dscore train pmlm`: a short u-PMLM fine-tune, held-out chain-rule perplexity before and after.

Every step is a resumable `dscore` command into a folder under --output (the teacher under --cache): a
rerun skips what is done. The table (one row per scorer) is printed and written to OUTPUT/summary.md.

    python examples/train_demo.py --output out/train-demo [--cache out/train-demo] [--parents 600] [--epochs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
from pathlib import Path

from distributed_scoring.cli import main as dscore
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.offline.models import fetch_model
from distributed_scoring.workflows.train.maskless_eval import parent_of
from distributed_scoring.workflows.train.run import TrainOptions, heldout_rows

SPECIES = ("human", "mouse")
CHAINS = ("H", "K", "L")
AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
PARENT_SEPARATOR = "~"
TARGETS = ("sentence", "token", "distribution")


def write_corpus(path: Path, parents: int, mutants: int, seed: int) -> Path:
    """A distillation corpus: `parents` germline V genes drawn with `seed` from the distinct genes of
    SPECIES x CHAINS (id species:chain:gene), each followed by `mutants` point mutants with 1 to 3 random
    residue substitutions (id <parent id>~m<j>: `--parent-separator ~`). One JSONL row each, residues
    space-separated; families in random order, so that any prefix of the file holds whole families.
    The file is rewritten only when its content would change (the teacher run's input stays as it was)."""
    genes = [
        (f"{s}:{c}:{name}", sequence)
        for s in SPECIES
        for c in CHAINS
        for name, sequence in sorted(v_genes(s, c).items())
    ]
    unique = list({sequence: (name, sequence) for name, sequence in genes}.values())
    rng = random.Random(seed)
    rows = []
    for name, parent in rng.sample(unique, min(parents, len(unique))):
        rows.append((name, parent))
        rows += [
            (f"{name}{PARENT_SEPARATOR}m{j}", mutated(parent, rng.randint(1, 3), rng)) for j in range(1, mutants + 1)
        ]
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


def heldout_parents(corpus: Path, seed: int, share: float) -> dict[str, str]:
    """The parents `dscore train maskless --parent-separator ~ --seed S --heldout H` keeps out of training
    (with all their mutants): {id: text}, in corpus order."""
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    parents = [r for r in rows if parent_of(r["id"], PARENT_SEPARATOR) == r["id"]]
    held = heldout_rows([r["id"] for r in parents], seed, share)
    return {r["id"]: r["text"] for r, h in zip(parents, held) if h}


def write_nbest(path: Path, chains: dict[str, str], n_best: int, seed: int) -> Path:
    """An N-best list per held-out chain: the chain itself and `n_best - 1` copies with 1 to 3 random
    residue substitutions, the "sequence model" score -(substitutions) + N(0, 1) noise, so its 1-best is
    often wrong and an LM that knows antibodies can repair the ranking (as tests/helpers/rescoring.py
    builds them). Texts are space-separated residues; WER counts wrong residues."""
    rng = random.Random(seed)
    records = []
    for name, truth in chains.items():
        residues = truth.split()
        hypotheses = {truth: 0}
        while len(hypotheses) < n_best:
            k = rng.randint(1, 3)
            hypotheses.setdefault(" ".join(mutated("".join(residues), k, rng)), k)
        ranked = sorted(((-k + rng.gauss(0, 1), text) for text, k in hypotheses.items()), reverse=True)
        records += [
            {"utt_id": name, "hyp_id": rank, "text": text, "score": score, "ref": truth}
            for rank, (score, text) in enumerate(ranked, start=1)
        ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run(*args: str) -> dict:
    """A dscore command; its printed JSON result (stdout), or exit with its code."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = dscore(list(args))
    if code != 0:
        sys.exit(code)
    return json.loads(buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/train-demo", help="folder of every step's run")
    parser.add_argument("--cache", default=None, help="folder of the corpus and the teacher run (default: --output)")
    parser.add_argument("--parents", type=int, default=600, help="germline chains in the corpus")
    parser.add_argument("--mutants", type=int, default=2, help="point mutants of each")
    parser.add_argument("--targets", default=",".join(TARGETS), help="maskless targets to train, comma-separated")
    parser.add_argument("--epochs", type=int, default=2, help="maskless training epochs")
    parser.add_argument("--freeze-layers", type=int, default=4, help="AntiBERTy layers (of 8) kept as they are")
    parser.add_argument("--lr", type=float, default=1e-4, help="maskless peak learning rate (encoder)")
    parser.add_argument("--pmlm-steps", type=int, default=60, help="u-PMLM steps (0: skip)")
    parser.add_argument("--pmlm-chains", type=int, default=240, help="the corpus's first chains the u-PMLM step uses")
    parser.add_argument("--utterances", type=int, default=8, help="N-best utterances per split (dev, test)")
    parser.add_argument("--n-best", type=int, default=4, help="hypotheses per utterance")
    parser.add_argument("--speed-sentences", default="32", help="held-out chains the student and the PLL are timed on")
    parser.add_argument("--cpus-per-worker", default="2", help="CPUs (torch threads) of the training worker")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    output = Path(args.output)
    cache = Path(args.cache) if args.cache else output
    model = str(fetch_model("antiberty"))
    corpus = write_corpus(cache / "corpus.jsonl", args.parents, args.mutants, args.seed)
    common = ["--batch-size", "8", "--seed", str(args.seed), "--cpus-per-worker", args.cpus_per_worker]

    run(
        "score",
        str(corpus),
        "--id-column",
        "id",
        "--model",
        model,
        "--output",
        str(cache / "teacher"),
        "--shard-rows",
        "20",
        "--per-token",
        "--conditionals",
        "25",
    )

    chains = heldout_parents(corpus, args.seed, TrainOptions().heldout)
    names = list(chains)[: 2 * args.utterances]
    output.mkdir(parents=True, exist_ok=True)
    splits = {
        split: write_nbest(output / f"nbest-{split}.jsonl", {n: chains[n] for n in part}, args.n_best, seed)
        for split, part, seed in (("dev", names[: args.utterances], 1), ("test", names[args.utterances :], 2))
    }
    reports = {}
    for target in args.targets.split(","):
        reports[target] = run(
            "train",
            "maskless",
            "--teacher",
            str(cache / "teacher"),
            "--model",
            model,
            "--output",
            str(output / f"maskless-{target}"),
            "--target",
            target,
            "--parent-separator",
            PARENT_SEPARATOR,
            "--epochs",
            str(args.epochs),
            "--lr",
            str(args.lr),
            "--freeze-layers",
            str(args.freeze_layers),
            "--nbest-dev",
            str(splits["dev"]),
            "--nbest-test",
            str(splits["test"]),
            "--speed-sentences",
            args.speed_sentences,
            *common,
        )
    pmlm = None
    if args.pmlm_steps:
        lines = corpus.read_text().splitlines(keepends=True)[: args.pmlm_chains]
        data = output / "pmlm-corpus.jsonl"
        if not data.exists() or data.read_text() != "".join(lines):
            data.write_text("".join(lines))
        pmlm = run(
            "train",
            "pmlm",
            "--data",
            str(data),
            "--id-column",
            "id",
            "--model",
            model,
            "--output",
            str(output / "pmlm"),
            "--steps",
            str(args.pmlm_steps),
            *common,
        )
    table = render(reports, pmlm)
    (output / "summary.md").write_text(table)
    print("\n" + table)
    return 0


def render(reports: dict[str, dict], pmlm: dict | None) -> str:
    """One table: `unmasked` and every student against the teacher on the held-out chains, with rescoring
    and speed; then the u-PMLM figures."""
    first = next(iter(reports.values()))
    h, t, rescoring = first["heldout"], first["training"], first["rescoring"]

    def cell(value: float | None, digits: int = 3) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    def row(name: str, f: dict, wer: float | None, speedup: float | None) -> str:
        return (
            f"| {name} | {cell(f['pearson'])} | {cell(f['spearman'])} | {cell(f['pearson_per_token'])} | "
            f"{cell(f['rmse'], 2)} | {cell(f.get('token_terms', {}).get('pearson'))} | "
            f"{cell(f.get('mutant_minus_parent', {}).get('spearman'))} | {cell(wer, 4)} | "
            f"{'–' if speedup is None else f'{speedup:.0f}x'} |"
        )

    lines = [
        f"## Maskless AntiBERTy ({first['rows']['train']} training chains, {t['steps']} steps of {t['batch_size']}, "
        f"{t['freeze_layers']} of 8 layers frozen; {h['rows']} held-out chains, {h['mutant_pairs']} mutant-parent "
        "pairs)",
        "",
        "| scorer | Pearson | Spearman | Pearson per residue | RMSE (nats) | residue terms r | mutant - parent rho | "
        "rescored WER (test) | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        row("length-only baseline", h["length_baseline"], None, None),
        row("unmasked (no training)", h["unmasked"], rescoring["unmasked"]["test"]["rescored"], None),
        *[
            row(
                f"student: {target}",
                r["heldout"]["student"],
                r["rescoring"]["student"]["test"]["rescored"],
                r["speed"]["speedup"],
            )
            for target, r in reports.items()
        ],
        "",
        f"Rescoring {rescoring['test']} (WER over residues): baseline {rescoring['teacher']['test']['baseline']:.4f}, "
        f"teacher (PLL) {rescoring['teacher']['test']['rescored']:.4f}, "
        f"oracle {rescoring['teacher']['test']['oracle']:.4f}. "
        f"Teacher PLL std on the held-out chains: {h['teacher_std']:.2f} nats. Speed-ups timed inside each training "
        f"job ({first['speed']['device']}, {first['speed']['threads']} threads, load average "
        f"{first['speed']['load_average']:.1f} for the first): "
        "benchmarks/maskless_speed.py times them on a quiet machine.",
    ]
    if pmlm is not None:
        before, after = pmlm["heldout"]["before"], pmlm["heldout"]["after"]
        lines += [
            "",
            f"## u-PMLM fine-tune ({pmlm['training']['steps']} steps; {before['sentences']} held-out chains)",
            "",
            "| | PPL left to right | PPL random order |",
            "|---|---:|---:|",
            f"| AntiBERTy | {before['ppl_l2r']:.3f} | {before['ppl_random']:.3f} |",
            f"| after u-PMLM | {after['ppl_l2r']:.3f} | {after['ppl_random']:.3f} |",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
