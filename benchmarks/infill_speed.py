"""Infilling speed against the authors' implementation (Calef et al., HCB beam search), outputs checked first.

    python benchmarks/infill_speed.py --authors-code DIR --update-results benchmarks/RESULTS.md
    python benchmarks/infill_speed.py --smoke          # our side only, a tiny random model: runs in seconds

DIR is a checkout of rcalef/hcb_infilling (MIT): its `hcb_infilling` package is imported from there at
run time, nothing of it lives in this repository. Without --authors-code only our side runs, and the
run says so.

Inputs (--models): AntiBERTy (real weights, 8 layers, hidden 512, V = 25: 5 specials and 20 residues)
on human germline heavy V genes, one residue per token, with k contiguous residues masked at a seeded
position (k = 3 and 5, --masks); and two random BERTs of the other harnesses on BLiMP-like sentences
(k contiguous word pieces masked): `bert-tiny` (2 layers, hidden 64, 1,000-piece WordPiece), whose LM
head at one position costs about what the encoder costs per token, and `bert-small` (4 layers, hidden
256, 30,522-piece WordPiece), whose head costs 2.5 times that, as with English vocabularies. They are
built on first use (a few minutes, cached).

Check first: every (decoder, order) of standard / hcb x l2r / best-to-worst runs through the authors'
`decode_{standard,modified}_{LeftToRight,BestToWorst}_vectorized` and through our `InfillEngine` on the
same masked inputs with the same beam; the top beams must be the same fills in the same order, with
scores (their float32 sum, our chain or hcb score) within --atol. Their candidates are the whole
vocabulary, special tokens included; ours are the `allowed` tokens. With real weights ours keeps its
default (every non-special token: a masked residue's top candidates are residues); with random weights
specials are as likely as any token, so both search the whole vocabulary (`allowed` = every id).
Any difference stops the run with the beams side by side, before anything is timed.

Timed (model loading excluded) for the k in --time-masks (3), per (decoder, order), in rounds that run
every method once in rotating order, after the check (which warms every method up); median reported:
  theirs-bN   their function on all N examples in one call (their API takes a batch of inputs padded
              to the longest, with the same number of masks each; their script uses 16 a call)
  theirs-b1   one example per call (left-to-right only: best-to-worst fails with one input per call,
              `get_best_masked_positions` squeezes the position tensor to 0-d)
  ours        `InfillEngine.search` on all N examples, CPU token budget 1024 (the default)
  ours-4096   the same under a budget of 4,096 tokens (--extra-budgets)

FLOPs (matmuls only, 2 per multiply-add), counted before any timing with gpu_core.py's `copy_flops`
formula: a forward row of L tokens costs the encoder N * (8*L*d^2 + 4*L*d*d_ff + 4*L^2*d), and every
position the LM head is applied to 2*d^2 + 2*d*V. The useful work of one example (length L, k masks,
beam B) is the search's rows at their own length, 1 at the first step and B at each later one, with
the head at the position each row fills (left-to-right) or at each of its remaining masked positions
(best-to-worst needs every remaining position's distribution to choose). Both implementations get the
same useful count, so useful GFLOP/s compare like examples/s; "executed / useful" adds what each runs
beyond it (padding to a batch's longest row; their head and log-softmax at every position of every
row). Ours is checked against a count of the rows and positions the engine actually sends to the
model. The ceiling: a float32 n x n matmul (torch.matmul, --matmul-size) timed at the start and at the
end of the same run, on the same threads; "of matmul" = useful GFLOP/s / that.

On a machine shared with other work use `--threads 1 --clock cpu`: each implementation then runs on one
core and is timed by this process's CPU time, which preemption does not inflate (with two threads on
two busy cores, one thread waits for the other and identical rounds vary tenfold). That run takes
about 13 minutes on the 2-core development machine, the AntiBERTy blocks most of it; --smoke checks
every code path in seconds (our side only, unless --authors-code is given too).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.infill import InfillEngine, InfillExample, InfillSettings
from distributed_scoring.engine.masked_lm import MaskedLM, load_masked_lm

import machine
import results_md
from gpu_core import copy_flops, shape_of

logger = logging.getLogger("infill_speed")

COMBOS = (("standard", "l2r"), ("standard", "best-to-worst"), ("hcb", "l2r"), ("hcb", "best-to-worst"))
THEIRS = {
    ("standard", "l2r"): "decode_standard_LeftToRight_vectorized",
    ("standard", "best-to-worst"): "decode_standard_BestToWorst_vectorized",
    ("hcb", "l2r"): "decode_modified_LeftToRight_vectorized",
    ("hcb", "best-to-worst"): "decode_modified_BestToWorst_vectorized",
}
RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
MODELS = ("antiberty", "bert-tiny", "bert-small")
CLOCKS = {"wall": "the wall clock", "cpu": "this process's CPU time (time.process_time)"}

# A method's answer: per example, its beams best first as (tokens in position order, score).
Beams = list[list[tuple[tuple[int, ...], float]]]


class Disagreement(SystemExit):
    """The two implementations filled differently: their speeds would not compare."""


@dataclass
class Block:
    """One model and one masked-span size: the examples, and whether ours may fill special tokens."""

    model: str
    what: str
    mlm: MaskedLM
    examples: list[InfillExample]
    k: int
    allowed: np.ndarray  # (V,) bool
    timed: bool
    rows: list[dict] = field(default_factory=list)

    @property
    def allowed_note(self) -> str:
        return "every id" if self.allowed.all() else "non-special"


# ---------------------------------------------------------------------------------------------------
# Models and inputs.


def smoke_model(root: Path) -> Path:
    """A random residue-level BERT (2 layers, hidden 32) with AntiBERTy's vocabulary layout: no download."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *RESIDUES])}
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,
    )
    BertForMaskedLM(config).eval().save_pretrained(root)
    BertTokenizer(vocab=vocab, do_lower_case=False, model_max_length=128).save_pretrained(root)
    return root


def random_bert(name: str, root: Path) -> Path:
    """The random BERTs of the other harnesses, built once: `bert-tiny` (joints_speed.py: 2 layers, hidden 64,
    1,000-piece WordPiece) and `bert-small` (scaling.py: 4 layers, hidden 256, 30,522-piece WordPiece)."""
    import synthetic
    from scaling import small_bert

    if name == "bert-small":
        return small_bert(root)
    return synthetic.small_bert_folder(root, "bert-tiny", 1000, hidden=64, layers=2, heads=2, ffn=128)


def non_special(mlm: MaskedLM) -> np.ndarray:
    """Our default candidates, as the infill workload builds them: every token id but the specials."""
    from distributed_scoring.workloads.infill import allowed_tokens

    return allowed_tokens(mlm.tokenizer, mlm.model.config.vocab_size, None)


def masked_examples(mlm: MaskedLM, texts: list[str], k: int, seed: int) -> list[InfillExample]:
    """Each text tokenised with its specials, k contiguous non-special tokens masked at a seeded start."""
    rng = random.Random(seed)
    out = []
    for i, text in enumerate(texts):
        encoding = mlm.tokenizer(text, return_special_tokens_mask=True)
        ids = np.array(encoding["input_ids"], dtype=np.int64)
        inner = np.flatnonzero(~np.array(encoding["special_tokens_mask"], dtype=bool))
        if len(inner) < k:
            raise SystemExit(f"cannot mask {k} tokens of {text[:40]!r}: it has {len(inner)}")
        start = rng.randint(int(inner[0]), int(inner[-1]) - k + 1)
        masks = np.arange(start, start + k)
        ids[masks] = mlm.mask_token_id
        out.append(InfillExample(ids, masks, seed=i))
    return out


def blocks(args: argparse.Namespace) -> list[Block]:
    """The (model, k) blocks of the run: checked all, timed where k is in --time-masks."""
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="infill-smoke-") as folder:  # loaded, it is no longer needed
            mlm = load_masked_lm(ModelSpec(str(smoke_model(Path(folder)))))
        rng = random.Random(3)
        texts = [" ".join(rng.choices(RESIDUES, k=rng.randint(24, 32))) for _ in range(args.examples)]
        return [
            Block(
                "random residue BERT 2x32",
                "random residues",
                mlm,
                masked_examples(mlm, texts, k, seed=k),
                k,
                np.ones(mlm.model.config.vocab_size, dtype=bool),
                k in args.time_masks,
            )
            for k in args.masks
        ]

    from distributed_scoring.offline.antibodies import spaced, v_genes
    from distributed_scoring.offline.models import cache_root, fetch_model

    out = []
    if "antiberty" in args.models:
        mlm = load_masked_lm(ModelSpec(str(fetch_model("antiberty"))))
        texts = [spaced(g) for g in random.Random(0).sample(sorted(v_genes("human").values()), args.examples)]
        out += [
            Block(
                "AntiBERTy",
                "germline VH",
                mlm,
                masked_examples(mlm, texts, k, seed=k),
                k,
                non_special(mlm),
                k in args.time_masks,
            )
            for k in args.masks
        ]
    for name in [m for m in args.models if m != "antiberty"]:
        import synthetic

        mlm = load_masked_lm(
            ModelSpec(
                str(random_bert(name, Path(args.models_dir) if args.models_dir else cache_root() / "bench-models"))
            )
        )
        texts = synthetic.sentences(args.small_examples, "blimp", seed=5)
        shape = shape_of(mlm.model)
        label = f"BERT {shape['N']}x{shape['d']}, V={shape['V']:,} (random)"
        out += [
            Block(
                label,
                "BLiMP-like",
                mlm,
                masked_examples(mlm, texts, k, seed=k),
                k,
                np.ones(mlm.model.config.vocab_size, dtype=bool),
                k in args.time_masks,
            )
            for k in args.masks
        ]
    return out


# ---------------------------------------------------------------------------------------------------
# FLOPs.


def encoder_flops(length: int, shape: dict) -> float:
    """One forward row of `length` tokens through the encoder (copy_flops less its head)."""
    return copy_flops(length, 1, **shape) - copy_flops(0, 1, **shape)


def head_flops(shape: dict) -> float:
    """The LM head at one position (copy_flops of an empty row)."""
    return copy_flops(0, 1, **shape)


def useful_flops(block: Block, beam: int, order: str, shape: dict) -> float:
    """The search's work: rows at their own length, the head where the fill order needs it."""
    width = min(beam, int(block.allowed.sum()))
    total = 0.0
    for e in block.examples:
        rows = 1
        for step in range(block.k):
            heads = rows * (block.k - step if order == "best-to-worst" else 1)
            total += rows * encoder_flops(len(e.input_ids), shape) + heads * head_flops(shape)
            rows = min(beam, rows * width)
    return total


def their_executed_flops(block: Block, beam: int, batch: int, shape: dict) -> float:
    """Their calls as run: every row padded to the call's longest, head at every position of every row."""
    total = 0.0
    for start in range(0, len(block.examples), batch):
        chunk = block.examples[start : start + batch]
        width = max(len(e.input_ids) for e in chunk)
        rows = len(chunk) * (1 + beam * (block.k - 1))
        total += rows * (encoder_flops(width, shape) + width * head_flops(shape))
    return total


class CountingLogits:
    """Wraps `mlm.logits_at` to count what the engine sends to the model: useful and executed FLOPs."""

    def __init__(self, mlm: MaskedLM, shape: dict) -> None:
        self.mlm, self.shape, self.inner = mlm, shape, mlm.logits_at
        self.useful = self.executed = 0.0

    def __call__(self, input_ids, attention_mask, positions, rows=None):
        head = len(positions) * head_flops(self.shape)
        self.useful += sum(encoder_flops(int(n), self.shape) for n in attention_mask.sum(axis=1)) + head
        self.executed += len(input_ids) * encoder_flops(input_ids.shape[1], self.shape) + head
        return self.inner(input_ids, attention_mask, positions, rows)

    def __enter__(self) -> "CountingLogits":
        self.mlm.logits_at = self  # the instance attribute shadows the method
        return self

    def __exit__(self, *exc) -> None:
        del self.mlm.logits_at


def clocked(fn: Callable[[], object]) -> dict[str, float]:
    """Seconds of `fn()` on both clocks: `wall` (time.perf_counter) and `cpu` (this process's CPU time,
    time.process_time, which a process preempted by other work does not accrue)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def matmul_gflops(n: int, clock: str, repeats: int = 3, samples: int = 5) -> list[float]:
    """float32 n x n matmul throughput, `samples` timings of `repeats` products each (after a warm-up)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    seconds = [clocked(lambda: [a @ b for _ in range(repeats)])[clock] for _ in range(samples)]
    return [2 * n**3 * repeats / s / 1e9 for s in seconds]


# ---------------------------------------------------------------------------------------------------
# The two implementations.


def load_authors(folder: Path):
    """Their `hcb_infilling.decode`, imported from a checkout of rcalef/hcb_infilling, and its commit."""
    if not (folder / "hcb_infilling" / "decode.py").exists():
        raise SystemExit(
            f"--authors-code {folder}: no hcb_infilling/decode.py there; give a checkout of "
            "rcalef/hcb_infilling (its top folder, which holds hcb_infilling/)"
        )
    sys.path.insert(0, str(folder.resolve()))
    decode = importlib.import_module("hcb_infilling.decode")
    if not Path(decode.__file__).resolve().is_relative_to(folder.resolve()):
        raise SystemExit(f"hcb_infilling was imported from {decode.__file__}, not from {folder}")
    try:
        top, commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError, ValueError):
        top, commit = "", ""
    if Path(top).resolve() != folder.resolve():
        commit = "an unknown commit (not a git checkout)"
    return decode, commit


def theirs(
    decode, mlm: MaskedLM, examples: list[InfillExample], decoder: str, order: str, beam: int, batch: int
) -> Beams:
    """Their decode function on `batch` examples a call, inputs padded to the call's longest."""
    function = getattr(decode, THEIRS[decoder, order])
    out: Beams = []
    for start in range(0, len(examples), batch):
        chunk = examples[start : start + batch]
        width = max(len(e.input_ids) for e in chunk)
        ids = torch.full((len(chunk), width), mlm.pad_token_id, dtype=torch.long)  # (n, W)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)  # (n, W)
        for r, e in enumerate(chunk):
            ids[r, : len(e.input_ids)] = torch.from_numpy(e.input_ids)
            attention[r, : len(e.input_ids)] = 1
        result = function(
            model=mlm.model, input_ids=ids, attention_mask=attention, beam_size=beam, mask_id=mlm.mask_token_id
        )
        out.extend([[(tuple(int(t) for t in entry[1:]), float(entry[0])) for entry in per] for per in result])
    return out


def ours(engine: InfillEngine, examples: list[InfillExample], decoder: str, order: str, beam: int) -> Beams:
    fills = engine.search(examples, InfillSettings(decoder, order, beam))
    return [[(tuple(f.tokens.tolist()), f.hcb if decoder == "hcb" else f.chain) for f in per] for per in fills]


# ---------------------------------------------------------------------------------------------------
# Agreement.


def beams_text(beams: list[tuple[tuple[int, ...], float]], tokenizer, specials: set[int]) -> str:
    return "; ".join(
        f"{' '.join(tokenizer.convert_ids_to_tokens(list(t)))}{' (special!)' if specials & set(t) else ''} {s:.5f}"
        for t, s in beams
    )


def compare(
    block: Block, decoder: str, order: str, mine: Beams, their: Beams, atol: float, name: str
) -> tuple[float, list[str]]:
    """The largest score difference over matching beams, and a description of every example that differs."""
    tokenizer = block.mlm.tokenizer
    specials = set(tokenizer.all_special_ids)
    worst, problems = 0.0, []
    for i, (a, b) in enumerate(zip(mine, their, strict=True)):
        same = [ta for ta, _ in a] == [tb for tb, _ in b]
        diff = max(abs(sa - sb) for (_, sa), (_, sb) in zip(a, b)) if same else float("inf")
        worst = max(worst, diff)
        if not same or diff > atol:
            gaps = [b[j][1] - b[j + 1][1] for j in range(len(b) - 1)]
            problems.append(
                f"{block.model} k={block.k} {decoder}/{order} example {i} (masks {block.examples[i].masks.tolist()}):\n"
                f"  ours: {beams_text(a, tokenizer, specials)}\n"
                f"  {name}: {beams_text(b, tokenizer, specials)}\n"
                f"  smallest gap between {name}'s consecutive scores: {min(gaps, default=float('nan')):.2e}"
            )
    return worst, problems


# ---------------------------------------------------------------------------------------------------
# Timing.


def methods_of(
    block: Block, decoder: str, order: str, decode, args: argparse.Namespace
) -> dict[str, Callable[[], Beams]]:
    """The methods of one (decoder, order) row, by name: theirs (when given) first, then ours. A block
    that is only checked runs theirs on all its examples at once and ours at the default budget."""
    mlm, examples, n = block.mlm, block.examples, len(block.examples)
    out: dict[str, Callable[[], Beams]] = {}
    if decode is not None:
        out[f"theirs-b{n}"] = lambda: theirs(decode, mlm, examples, decoder, order, args.beam, n)
        if order == "l2r" and n > 1 and block.timed:
            out["theirs-b1"] = lambda: theirs(decode, mlm, examples, decoder, order, args.beam, 1)
    for i, budget in enumerate([args.batch_tokens, *(args.extra_budgets if block.timed else [])]):
        engine = InfillEngine(mlm, block.allowed, budget)
        out[f"ours-{budget}" if i else "ours"] = lambda engine=engine: ours(engine, examples, decoder, order, args.beam)
    return out


def check_block(block: Block, decode, args: argparse.Namespace) -> list[str]:
    """Every (decoder, order) of the block once through every method (this also warms them up): the
    FLOPs counted, ours against theirs. Returns a description of every example that differs."""
    shape = shape_of(block.mlm.model)
    problems = []
    for decoder, order in COMBOS:
        useful = useful_flops(block, args.beam, order, shape)
        row = {
            "decoder": decoder,
            "order": order,
            "useful_gflop": useful / 1e9,
            "max_score_diff": None,
            "executed_over_useful": {},
            "seconds": {},
        }
        answers = {}
        for name, method in methods_of(block, decoder, order, decode, args).items():
            if name.startswith("theirs"):
                answers[name] = method()
                batch = int(name.removeprefix("theirs-b"))
                row["executed_over_useful"][name] = their_executed_flops(block, args.beam, batch, shape) / useful
                continue
            with CountingLogits(block.mlm, shape) as counted:
                answers[name] = method()
            if abs(counted.useful - useful) > 1e-9 * useful:
                raise SystemExit(
                    f"FLOP count: {name} ran {counted.useful:.6g} useful FLOPs, the formula says "
                    f"{useful:.6g} ({block.model} k={block.k} {decoder}/{order})"
                )
            row["executed_over_useful"][name] = counted.executed / useful
        for name, answer in answers.items():
            if name == "ours":
                continue
            worst, found = compare(block, decoder, order, answers["ours"], answer, args.atol, name)
            problems += found
            if name.startswith("theirs"):
                row["max_score_diff"] = max(row["max_score_diff"] or 0.0, worst)
        logger.info(
            "%s k=%d %s/%s checked: largest score difference from theirs %s",
            block.model,
            block.k,
            decoder,
            order,
            "n/a" if row["max_score_diff"] is None else f"{row['max_score_diff']:.1e}",
        )
        block.rows.append(row)
    return problems


def time_block(block: Block, decode, args: argparse.Namespace) -> None:
    """Interleaved rounds of every method of every (decoder, order); medians into the block's rows."""
    n = len(block.examples)
    for row in block.rows:
        methods = methods_of(block, row["decoder"], row["order"], decode, args)
        names = list(methods)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                both = clocked(methods[name])
                row["seconds"].setdefault(name, []).append(both[args.clock])
                row.setdefault("seconds_both_clocks", {}).setdefault(name, []).append(both)
        base = statistics.median(row["seconds"]["ours"])
        row["methods"] = {
            name: {
                "median_s": statistics.median(s),
                "examples_per_s": n / statistics.median(s),
                "gflops": row["useful_gflop"] / statistics.median(s),
                "vs_ours": statistics.median(s) / base,
            }
            for name, s in row["seconds"].items()
        }
        logger.info(
            "%s k=%d %s/%s: %s",
            block.model,
            block.k,
            row["decoder"],
            row["order"],
            ", ".join(f"{m} {v['examples_per_s']:.2f}/s" for m, v in row["methods"].items()),
        )


# ---------------------------------------------------------------------------------------------------
# Report.


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    peak = result["matmul_gflops"]
    lines = [
        f"CPU: {m['cpu']}, {m['logical_cores']} logical cores, torch threads {m['torch_threads']} for both, "
        f"timed by {CLOCKS[s['clock']]}; "
        f"python {m['python']}, torch {m['versions']['torch']}, transformers {m['versions']['transformers']}, "
        f"float32, SDPA attention, the same model object for both.",
        (
            f"Theirs: rcalef/hcb_infilling at {result['authors_commit']}. "
            if result["authors_commit"]
            else "Theirs: not run (no --authors-code). "
        )
        + f"Beam {s['beam']}; median of {s['rounds']} interleaved rounds after a checked warm-up; our budget "
        f"{s['batch_tokens'] or 1024} tokens; float32 matmul (n = {s['matmul_size']}) {peak:.1f} GFLOP/s "
        f"(median of {len(result['matmul_samples'])} timings at the start and end: "
        f"{min(result['matmul_samples']):.1f} to {max(result['matmul_samples']):.1f}); "
        f"1-minute load average {result['load_average'][0]:.1f} at the start, {result['load_average'][1]:.1f} at "
        "the end.",
        "",
        "Agreement (top beams as the same fills in the same order; largest score difference over them):",
        "",
        "| model | inputs | examples | tokens/example | k | candidates (ours) | standard l2r | standard b2w | hcb l2r "
        "| hcb b2w |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for b in result["blocks"]:
        diffs = [r["max_score_diff"] for r in b["rows"]]
        lines.append(
            f"| {b['model']} | {b['what']} | {b['examples']} | {b['mean_length']:.0f} | {b['k']} | "
            f"{b['allowed']} | " + " | ".join("not run" if d is None else f"same, {d:.1e}" for d in diffs) + " |"
        )
    lines += [
        "",
        "| model | k | decoder | order | method | examples/s | useful GFLOP/s | of matmul "
        "| executed / useful | ours' speed-up |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for b in result["blocks"]:
        for r in b["rows"]:
            for name, v in r.get("methods", {}).items():
                ratio = r["executed_over_useful"].get(name)
                lines.append(
                    f"| {b['model']} | {b['k']} | {r['decoder']} | {r['order']} | {name} | {v['examples_per_s']:.3g} "
                    f"| {v['gflops']:.1f} | {v['gflops'] / peak:.0%} | {'' if ratio is None else f'{ratio:.2f}'} "
                    f"| {v['vs_ours']:.2f}x |"
                )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--authors-code", type=Path, help="a checkout of rcalef/hcb_infilling (else: ours only)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, few examples, one round")
    parser.add_argument("--examples", type=int, help="examples per AntiBERTy (smoke: random) block (8; smoke 4)")
    parser.add_argument("--masks", default="3,5", help="span lengths k checked, comma-separated")
    parser.add_argument("--time-masks", default="3", help="span lengths k also timed ('' for none)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--rounds", type=int, help="timed rounds (default 3; smoke 1)")
    parser.add_argument("--batch-tokens", type=int, help="our token budget (default: the engine's CPU default)")
    parser.add_argument("--extra-budgets", default="4096", help="more budgets for ours, one row each ('' for none)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--small-examples", type=int, default=16, help="examples per block of the random BERTs")
    parser.add_argument("--atol", type=float, default=1e-3, help="largest score difference allowed")
    parser.add_argument("--matmul-size", type=int, help="n of the n x n matmul (default 1024; smoke 256)")
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads for both (default: all); 1 on a machine shared with other work",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what is timed: wall-clock seconds, or this process's CPU seconds (with --threads 1, "
        "the compute time a busy machine leaves undisturbed by preemption); both are kept in the "
        "raw numbers",
    )
    parser.add_argument("--models-dir", default=None, help="where the tiny BERT is saved (default: the cache)")
    parser.add_argument("--update-results", type=Path, help="also write the tables into this RESULTS.md")
    args = parser.parse_args()
    args.examples = args.examples or (4 if args.smoke else 8)
    args.rounds = args.rounds or (1 if args.smoke else 3)
    args.matmul_size = args.matmul_size or (256 if args.smoke else 1024)
    args.masks = [int(k) for k in args.masks.split(",")]
    args.models = args.models.split(",")
    if unknown := set(args.models) - set(MODELS):
        parser.error(f"unknown --models {', '.join(sorted(unknown))}; known: {', '.join(MODELS)}")
    args.time_masks = [int(k) for k in args.time_masks.split(",") if k]
    args.extra_budgets = [int(b) for b in args.extra_budgets.split(",") if b]
    if args.update_results and (args.smoke or not args.authors_code):
        parser.error("--update-results needs the full run against the authors' code (--authors-code, no --smoke)")
    return args


def main() -> None:
    args = parse_args()
    load_before = machine.start(args.threads, warn_busy=not args.smoke)
    decode, commit = (None, None)
    if args.authors_code:
        decode, commit = load_authors(args.authors_code)
    else:
        logger.warning(
            "no --authors-code: the authors' implementation is skipped (no agreement check, no "
            "comparison); give a checkout of rcalef/hcb_infilling to run it"
        )
    samples = matmul_gflops(args.matmul_size, args.clock)
    todo = blocks(args)
    problems = [p for block in todo for p in check_block(block, decode, args)]
    if problems:
        raise Disagreement("the implementations disagree (nothing was timed):\n" + "\n".join(problems))
    for block in todo:
        if block.timed:
            time_block(block, decode, args)
    samples += matmul_gflops(args.matmul_size, args.clock)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "settings": settings,
        "machine": machine.describe(),
        "authors_commit": commit,
        "matmul_samples": samples,
        "matmul_gflops": statistics.median(samples),
        "load_average": [load_before, os.getloadavg()[0]],
        "blocks": [
            {
                "model": b.model,
                "what": b.what,
                "k": b.k,
                "allowed": b.allowed_note,
                "examples": len(b.examples),
                "rows": b.rows,
                "mean_length": float(np.mean([len(e.input_ids) for e in b.examples])),
            }
            for b in todo
        ],
    }
    table = markdown(result)
    print(table)
    if not args.smoke:
        results_md.save_raw("infill-speed" if decode is not None else "infill-speed-ours-only", result)
    if args.update_results:
        results_md.update_section(args.update_results, "infill-speed", table, "benchmarks/infill_speed.py")


if __name__ == "__main__":
    main()
