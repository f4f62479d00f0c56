"""GPU throughput of the scoring core alone: PLL and one pass, bf16, a token-budget sweep, eager and compiled, MFU.

    python benchmarks/gpu_core.py --shapes bert-base --out OUT        # on a CUDA machine (~5 min a shape)
    python benchmarks/gpu_core.py --device cpu --smoke --out /tmp/x   # CPU check of the code paths

Scores synthetic sentences with `PLLEngine` (`--methods pll`) and with `MasklessEngine` reading each
sentence once, unmasked (`unmasked`: what `--method unmasked` and the token/distribution students
compute), directly: no Ray, no Parquet (pyarrow is not needed), only the engine modules, as one scoring
actor does. Models are the random BERT-base and
RoBERTa-base shapes of `synthetic.py`, loaded through `load_masked_lm`: float32 weights with the encoder
under bf16 autocast (`--precision autocast`, what `--dtype auto` runs on CUDA), or bf16 weights
(`--precision weights`, `--dtype bfloat16`); the LM head's log-softmax in float32 either way. The one pass
packs sentences of similar length as the engine does (`packing.ONE_PASS_PADDING`). Sentences go to the
engine in shards of --shard-rows, as the pipeline hands them to an actor. For each budget, with the
encoder eager and then compiled (`torch.compile(dynamic=True)`), one untimed round warms up (and
compiles), then --rounds timed rounds; the median is reported with peak GPU memory of the timed rounds.

FLOPs: matmul FLOPs (2 per multiply-add) of the useful work, counted before any timing. For a
sentence of L tokens (specials included) with n scored tokens, on an encoder of N layers, hidden d,
feed-forward d_ff and vocabulary V, the engine runs n copies of length L through the encoder and the
LM head on one row per copy:

    F = n * [ N * (8*L*d^2 + 4*L*d*d_ff + 4*L^2*d) + 2*d^2 + 2*d*V ]

(per layer and token: 4 projections 8d^2, feed-forward 4*d*d_ff, scores and weighted sum 4*L*d;
head: dense d->d and decoder d->V). One pass (`unmasked`) runs the encoder once and the head on the n
scored rows:

    F_unmasked = N * (8*L*d^2 + 4*L*d*d_ff + 4*L^2*d) + n * (2*d^2 + 2*d*V)

Embeddings, layer norms, softmax, GELU and biases are left out.
Padding inside packed batches is not useful work and is not counted; its share is reported apart
("executed / useful"). Achieved TFLOP/s = sum F / median time; MFU = that / the TFLOP/s of a large bf16
matmul (torch.matmul, n = --matmul-size) measured in the same run on the same device.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the GPU machine runs from a checkout, without installing the package

from distributed_scoring.config import ModelSpec  # noqa: E402
from distributed_scoring.engine import packing  # noqa: E402
from distributed_scoring.engine.masked_lm import MaskedLM, load_masked_lm  # noqa: E402
from distributed_scoring.engine.masking import Sentence, pack  # noqa: E402
from distributed_scoring.engine.maskless import MasklessEngine, Student  # noqa: E402
from distributed_scoring.engine.pll import PLLEngine  # noqa: E402
from distributed_scoring.offline.models import cache_root  # noqa: E402
from distributed_scoring.quiet import quiet_transformers  # noqa: E402

import machine  # noqa: E402
import synthetic  # noqa: E402
from results_md import update_section  # noqa: E402

logger = logging.getLogger("gpu_core")

PRECISIONS = {
    "autocast": "Encoder bf16 autocast over float32 weights, head float32",
    "weights": "bf16 weights, head logits and log-softmax float32",
}

SIZES = {
    "full": dict(sentences=4096, budgets="8192,16384,32768,65536,131072", rounds=3, matmul_size=8192),
    "smoke": dict(sentences=6, budgets="256,1024", rounds=1, matmul_size=1024),
}


# ---------------------------------------------------------------------------------------------------
# Inputs and FLOPs.


def encode(tokenizer, texts: list[str]) -> list[Sentence]:
    """The engine's inputs, by prepare.prepare_encoding's rule: targets are the non-special tokens.

    Written here because prepare.py needs pyarrow, which the GPU machine may lack; --smoke checks that
    both give the same sentences.
    """
    batch = tokenizer(texts, add_special_tokens=True, truncation=False, return_special_tokens_mask=True)
    out = []
    for i, ids in enumerate(batch["input_ids"]):
        special = np.array(batch["special_tokens_mask"][i], dtype=bool)
        words = [-1 if w is None else w for w in batch.word_ids(i)]
        out.append(Sentence(np.array(ids, dtype=np.int64), np.flatnonzero(~special), np.array(words, dtype=np.int64)))
    return out


def check_encode(mlm: MaskedLM, texts: list[str], sentences: list[Sentence]) -> None:
    try:
        from distributed_scoring.workloads.prepare import PLLPreparer
    except ImportError as exc:  # no pyarrow here: nothing to compare with
        logger.warning("encode() not checked against prepare.PLLPreparer: %s", exc)
        return
    for s, p in zip(sentences, PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts), strict=True):
        ours = (s.input_ids.tolist(), s.targets.tolist(), s.piece_words.tolist())
        if ours != (p.input_ids, p.targets, p.piece_words):
            raise SystemExit("gpu_core.encode and prepare.PLLPreparer disagree on a sentence; fix encode()")


def shape_of(model) -> dict:
    c = model.config
    return dict(N=c.num_hidden_layers, d=c.hidden_size, d_ff=c.intermediate_size, V=c.vocab_size)


METHODS = ("pll", "unmasked")


def encoder_flops(length: int, N: int, d: int, d_ff: int, **_: int) -> float:
    """Matmul FLOPs of one row of `length` tokens through the encoder."""
    return N * (8 * length * d**2 + 4 * length * d * d_ff + 4 * length**2 * d)


def head_flops(rows: int, d: int, V: int, **_: int) -> float:
    """Matmul FLOPs of the LM head (dense d->d, decoder d->V) on `rows` positions."""
    return rows * (2 * d**2 + 2 * d * V)


def copy_flops(length: int, rows: int, **shape: int) -> float:
    """Matmul FLOPs of `rows` masked copies of `length` tokens: encoder on every token, head on one row each."""
    return rows * (encoder_flops(length, **shape) + head_flops(1, **shape))


def sentence_flops(method: str, length: int, scored: int, shape: dict) -> float:
    """Useful FLOPs of one sentence: n masked copies (PLL) or one unmasked pass with the head on n rows."""
    if method == "pll":
        return copy_flops(length, scored, **shape)
    return encoder_flops(length, **shape) + head_flops(scored, **shape)


def useful_flops(method: str, sentences: list[Sentence], shape: dict) -> float:
    return sum(sentence_flops(method, len(s.input_ids), len(s.targets), shape) for s in sentences)


def executed_flops(
    method: str, shards: list[list[Sentence]], mlm: MaskedLM, budget: int, shape: dict
) -> tuple[float, float]:
    """FLOPs of the packed batches as run (padding included), and the seconds packing took on the host."""
    total, start = 0.0, time.perf_counter()
    for shard in shards:
        if method == "pll":
            for batch in pack(shard, "original", budget, mlm.mask_token_id, mlm.pad_token_id):
                rows, width = batch.input_ids.shape
                total += copy_flops(width, rows, **shape)
            continue
        lengths = [len(s.input_ids) for s in shard]
        batches = packing.pack(lengths, [1] * len(lengths), packing.TokenBudget(budget), packing.ONE_PASS_PADDING)
        for pieces in batches:
            width = max(lengths[p.group] for p in pieces)
            scored = sum(len(shard[p.group].targets) for p in pieces)
            total += len(pieces) * encoder_flops(width, **shape) + head_flops(scored, **shape)
    return total, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------
# Timing.


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Seconds of a block: CUDA events on a GPU (recorded on the stream, read after it drains), else the host clock."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, 0.0

    def __enter__(self) -> "Stopwatch":
        sync(self.device)
        if self.device.type == "cuda":
            self.events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.events[0].record()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.events[1].record()
            self.events[1].synchronize()
            self.seconds = self.events[0].elapsed_time(self.events[1]) / 1000
        else:
            self.seconds = time.perf_counter() - self.start


def matmul_tflops(device: torch.device, n: int, dtype: torch.dtype, repeats: int = 20) -> float:
    """Dense matmul throughput of this device: the peak that MFU is measured against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    with Stopwatch(device) as watch:
        for _ in range(repeats):
            a @ b
    return 2 * n**3 * repeats / watch.seconds / 1e12


Scorer = Callable[[list[Sentence]], list[np.ndarray]]


def scorer(method: str, mlm: MaskedLM, budget: int) -> Scorer:
    """Each sentence's per-token log-probabilities: masked copies (PLL) or one unmasked pass."""
    if method == "pll":
        return PLLEngine(mlm, "original", budget).token_logprobs
    engine = MasklessEngine(Student(mlm, None, {}, {}), budget)
    return lambda shard: [p.token_logprobs for p in engine.predict(shard)]


def score(engine: Scorer, shards: list[list[Sentence]]) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for shard in shards:
        out.extend(engine(shard))
    return out


def timed_rounds(
    engine: Scorer, device: torch.device, shards: list[list[Sentence]], rounds: int
) -> tuple[float, list[float], float | None, list[np.ndarray]]:
    """Seconds of the untimed warm-up round and of each timed round, peak GPU memory in GiB, last scores."""
    start = time.perf_counter()
    score(engine, shards)  # warm-up; compiles on the first call when the encoder is compiled
    sync(device)
    warmup = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(rounds):
        with Stopwatch(device) as watch:
            scores = score(engine, shards)
        seconds.append(watch.seconds)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return warmup, seconds, peak, scores


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------------------------------------------
# The sweep.


@dataclasses.dataclass
class Corpus:
    """One length distribution, ready for the engine, with each method's float32 reference on a few sentences."""

    lengths: str
    sentences: list[Sentence]
    shards: list[list[Sentence]]
    reference: dict[str, list[np.ndarray]]


def corpus(mlm: MaskedLM, lengths: str, args: argparse.Namespace) -> Corpus:
    texts = synthetic.sentences(args.sentences, lengths, seed=7)
    sentences = encode(mlm.tokenizer, texts)
    if args.smoke:
        check_encode(mlm, texts, sentences)
    shards = [sentences[i : i + args.shard_rows] for i in range(0, len(sentences), args.shard_rows)]
    # computed before anything is compiled: the bound that bf16 scores must stay within
    fp32 = load_masked_lm(ModelSpec(mlm.signature["model"], device=args.device, dtype="float32"))
    checked = sentences[: args.check_sentences]
    reference = {method: scorer(method, fp32, args.budgets[0])(checked) for method in args.methods}
    return Corpus(lengths, sentences, shards, reference)


def measure(
    method: str, mlm: MaskedLM, data: Corpus, budget: int, shape: dict, args: argparse.Namespace
) -> tuple[dict, list]:
    """One row of the table (rates, FLOPs, memory, bf16 difference from float32) and the scores."""
    warmup, seconds, peak_gib, scores = timed_rounds(scorer(method, mlm, budget), mlm.device, data.shards, args.rounds)
    useful = useful_flops(method, data.sentences, shape)
    executed, pack_s = executed_flops(method, data.shards, mlm, budget, shape)
    median = statistics.median(seconds)
    n_tokens = sum(len(s.targets) for s in data.sentences)
    row = {
        "method": method,
        "lengths": data.lengths,
        "budget": budget,
        "sentences": len(data.sentences),
        "scored_tokens": n_tokens,
        "warmup_s": warmup,
        "seconds": seconds,
        "median_s": median,
        "sentences_per_s": len(data.sentences) / median,
        "tokens_per_s": n_tokens / median,
        "useful_tflop": useful / 1e12,
        "executed_over_useful": executed / useful,
        "achieved_tflops": useful / median / 1e12,
        "peak_mem_gib": peak_gib,
        "host_pack_s": pack_s,
        "max_diff_vs_fp32": max_diff(data.reference[method], scores[: args.check_sentences]),
    }
    return row, scores


def load_bf16(folder: str, args: argparse.Namespace) -> MaskedLM:
    """The model in bf16 as --precision says: float32 weights under bf16 autocast (on any device, so that the
    CPU smoke runs it too), or bf16 weights."""
    if args.precision == "weights":
        return load_masked_lm(ModelSpec(folder, device=args.device, dtype="bfloat16"))
    return dataclasses.replace(
        load_masked_lm(ModelSpec(folder, device=args.device, dtype="float32")), autocast_dtype=torch.bfloat16
    )


def run_shape(shape_name: str, args: argparse.Namespace, peak_tflops: float, done: Callable[[dict], None]) -> None:
    """Every (compile, lengths, budget) row of one model shape, each handed to `done` as it is measured
    (so a run stopped by a time limit keeps what it measured); stops if bf16 drifts beyond --atol."""
    folder = synthetic.model_folder(shape_name, args.models_dir)
    mlm = load_bf16(str(folder), args)
    shape = shape_of(mlm.model)
    corpora = [corpus(mlm, lengths, args) for lengths in args.lengths]
    eager = {}
    for compiled in args.compile:
        if compiled:
            mlm.encoder.compile(dynamic=True)
        for method, data, budget in itertools.product(args.methods, corpora, args.budgets):
            row, scores = measure(method, mlm, data, budget, shape, args)
            key = (method, data.lengths, budget)
            if not compiled:
                eager[key] = scores
            vs_eager = max_diff(eager[key], scores) if compiled and key in eager else None
            row.update(
                shape=shape_name, compile=compiled, mfu=row["achieved_tflops"] / peak_tflops, max_diff_vs_eager=vs_eager
            )
            if row["max_diff_vs_fp32"] > args.atol or (vs_eager or 0.0) > args.atol:
                raise SystemExit(
                    f"{shape_name} {method} {data.lengths} budget {budget} compile={compiled}: bf16 "
                    f"scores differ by {row['max_diff_vs_fp32']:.3f} from float32 and {vs_eager} from "
                    f"eager (tolerance {args.atol})"
                )
            done(row)
            logger.info(
                "%s %s %s compile=%s budget %d: %.1f sentences/s, %.1f TFLOP/s, MFU %.1f%%",
                shape_name,
                method,
                data.lengths,
                compiled,
                budget,
                row["sentences_per_s"],
                row["achieved_tflops"],
                100 * row["mfu"],
            )


def markdown(result: dict) -> str:
    m, s = result["machine"], result["settings"]
    lines = [
        f"Device: {m.get('gpu') or m['cpu']}; torch {m['versions']['torch']}, "
        f"transformers {m['versions']['transformers']}, CUDA {m.get('cuda')}.",
        f"Peak: {result['matmul_tflops']:.1f} TFLOP/s ({result['matmul_dtype']} matmul, n={s['matmul_size']}). "
        f"{PRECISIONS[s['precision']]}; shards of {s['shard_rows']} sentences; median of {s['rounds']} rounds "
        "after a warm-up round; timed with CUDA events.",
        "",
        "| shape | method | lengths | compile | budget | sentences/s | tokens/s | TFLOP/s | MFU | executed / useful | "
        "host packing s | warm-up s | peak GiB | max diff vs fp32 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        peak = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        lines.append(
            f"| {r['shape']} | {r.get('method', 'pll')} | {r['lengths']} | "
            f"{'yes' if r['compile'] else 'no'} | {r['budget']} | "
            f"{r['sentences_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | {r['achieved_tflops']:.1f} | "
            f"{100 * r['mfu']:.1f}% | "
            f"{r['executed_over_useful']:.2f} | {r['host_pack_s']:.2f} | {r['warmup_s']:.1f} | {peak} | "
            f"{r['max_diff_vs_fp32']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (--smoke checks only)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every code path runs")
    parser.add_argument("--shapes", default=",".join(synthetic.SHAPES))
    parser.add_argument("--methods", default=",".join(METHODS), help="pll, unmasked, or both (comma-separated)")
    parser.add_argument("--lengths", default="blimp,librispeech")
    parser.add_argument("--sentences", type=int, help="sentences per length distribution (full: 4096)")
    parser.add_argument("--budgets", help="comma-separated token budgets (full: 8192 ... 131072)")
    parser.add_argument("--compile", default="off,on", help="off, on, or off,on")
    parser.add_argument("--rounds", type=int, help="timed rounds (full: 3)")
    parser.add_argument("--matmul-size", type=int, help="n of the n x n peak matmul (full: 8192)")
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="autocast", help="bf16 how")
    parser.add_argument("--check-sentences", type=int, default=32, help="sentences checked against float32")
    parser.add_argument("--atol", type=float, default=0.5, help="largest bf16 per-token difference allowed (nats)")
    parser.add_argument("--models-dir", type=Path, default=cache_root() / "benchmarks" / "models")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--update-results", type=Path, help="also write the table into this RESULTS.md")
    args = parser.parse_args()
    for key, value in SIZES["smoke" if args.smoke else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or check the code paths with --device cpu --smoke")
    args.shapes = args.shapes.split(",")
    args.lengths = args.lengths.split(",")
    args.methods = args.methods.split(",")
    if not set(args.methods) <= set(METHODS):
        raise SystemExit(f"--methods: choose among {', '.join(METHODS)}")
    args.budgets = [int(b) for b in args.budgets.split(",")]
    args.compile = [{"off": False, "on": True}[c] for c in args.compile.split(",")]
    return args


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    args = parse_args()
    quiet_transformers()
    dtype = torch.bfloat16
    device = torch.device(args.device)
    peak = matmul_tflops(device, args.matmul_size, dtype)
    logger.info("peak bf16 matmul: %.1f TFLOP/s", peak)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "settings": settings,
        "machine": machine.describe(),
        "matmul_tflops": peak,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "rows": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "gpu-core" if device.type == "cuda" else "gpu-core-cpu-smoke"

    def save(row: dict) -> None:
        result["rows"].append(row)
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (args.out / f"{stem}.md").write_text(markdown(result))

    for shape in args.shapes:
        run_shape(shape, args, peak, save)
    table = markdown(result)
    if args.update_results:
        update_section(args.update_results, "gpu-core", table, "benchmarks/gpu_core.py")
    print(table)


if __name__ == "__main__":
    main()
