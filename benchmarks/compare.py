"""Side by side on CPU: naive PLL, minicons' MaskedLMScorer and our engine, same sentences, same model.

    python benchmarks/compare.py --update-results benchmarks/RESULTS.md   # the full run (quiet machine)
    python benchmarks/compare.py --preset smoke --out /tmp/bench            # 3 sentences, 1 round: runs?

Methods, each scoring every text from its string (tokenisation included in the timing):
  naive-sentence  all masked copies of one sentence in one forward pass, full (n, L, V) logits
  minicons-bB     minicons 0.3.39 `MaskedLMScorer.sequence_score`, B sentences per call (all their
                  masked copies in one forward pass, padded to the call's longest), in its own venv
  engine          distributed_scoring's PLLEngine: copies packed longest-first under a token budget
                  (the CPU default, 1024, or --batch-tokens), LM head on the masked rows only
  engine-N        the same under a budget of N tokens (--extra-budgets, default 4096)
  naive-copy      (optional) one masked copy per forward pass, full logits
Models: BERT-base and RoBERTa-base shapes (random weights, tokenizers of their sizes trained offline,
see synthetic.py) on BLiMP-like and LibriSpeech-like lengths, and AntiBERTy (real weights) on IMGT
germline V genes. Every method runs in float32 with SDPA attention and the same torch thread count.

Before any rate is reported, every method's per-token log-probabilities must match the engine's
(same tokens scored, |difference| <= --atol); otherwise the run stops with the differences. Rounds
are interleaved (each round runs every method once, in rotating order) and the median is reported.
minicons runs in a subprocess of its own virtual environment (created on first use, minicons pins
transformers < 5); it times its scoring calls itself, so process start and model loading never count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import MaskedLM, load_masked_lm
from distributed_scoring.engine.masking import Sentence, mask_matrix
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.offline.models import cache_root, fetch_model
from distributed_scoring.workloads.prepare import PLLPreparer

import machine
import synthetic
from results_md import update_section

logger = logging.getLogger("compare")

HERE = Path(__file__).resolve().parent
MINICONS_TORCH = "torch==2.13.0"  # first, so pip keeps the CPU build instead of pulling CUDA wheels
MINICONS_REQUIREMENTS = ("minicons==0.3.39", "transformers==4.57.*")  # minicons calls batch_encode_plus (gone in 5)

# (model, length distribution) blocks of the table, in order.
CONFIGS = (
    ("bert-base", "blimp"),
    ("bert-base", "librispeech"),
    ("roberta-base", "blimp"),
    ("roberta-base", "librispeech"),
    ("antiberty", "antibody"),
)
PRESETS = {
    "full": dict(sentences=32, antibody_sentences=9, rounds=3),
    "smoke": dict(sentences=3, antibody_sentences=2, rounds=1),
}
MINICONS_METRIC = {"original": "original", "word_l2r": "within_word_l2r"}


class Disagreement(SystemExit):
    """Methods scored differently: the comparison would not be like with like."""


@dataclass(frozen=True)
class Corpus:
    model: str
    lengths: str
    texts: list[str]


# ---------------------------------------------------------------------------------------------------
# Our side: the engine and the naive baselines, in this process.


def prepared(mlm: MaskedLM, texts: list[str]) -> list[Sentence]:
    """Tokenise with the pipeline's own prepare stage; a text it refuses stops the benchmark."""
    out = []
    for text, p in zip(texts, PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts), strict=True):
        if p.error:
            raise SystemExit(f"cannot benchmark {text[:60]!r}: {p.error}")
        out.append(Sentence(np.array(p.input_ids), np.array(p.targets), np.array(p.piece_words)))
    return out


@torch.inference_mode()
def naive(mlm: MaskedLM, texts: list[str], variant: str, per_copy: bool) -> list[np.ndarray]:
    """All masked copies of one sentence in one forward pass (or one pass per copy), full logits."""
    out = []
    for s in prepared(mlm, texts):
        ids = torch.from_numpy(s.input_ids)
        masked = torch.from_numpy(mask_matrix(s, variant))  # (n, L)
        copies = torch.where(masked, mlm.mask_token_id, ids)  # (n, L)
        chunks = copies.split(1) if per_copy else [copies]
        logits = torch.cat([mlm.model(input_ids=c).logits for c in chunks])  # (n, L, V)
        rows = torch.arange(len(s.targets))
        targets = torch.from_numpy(s.targets)
        logprobs = torch.log_softmax(logits[rows, targets].float(), dim=-1)  # (n, V)
        out.append(logprobs[rows, ids[targets]].double().numpy())
    return out


def engine(mlm: MaskedLM, texts: list[str], variant: str, batch_tokens: int) -> list[np.ndarray]:
    return PLLEngine(mlm, variant, batch_tokens).token_logprobs(prepared(mlm, texts))


# ---------------------------------------------------------------------------------------------------
# minicons: its own virtual environment and a worker process.


def ensure_minicons_env(venv: Path) -> Path:
    """The python of a venv holding minicons and its pinned dependencies; made (minutes) when missing."""
    requirements = (MINICONS_TORCH, *MINICONS_REQUIREMENTS)
    stamp = venv / f".dscore-{hashlib.sha1(' '.join(requirements).encode()).hexdigest()[:12]}"
    python = venv / "bin" / "python"
    if stamp.exists():
        return python
    logger.info("creating the minicons environment in %s (%s)", venv, ", ".join(requirements))
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, MINICONS_TORCH], check=True)
    subprocess.run([*pip, *MINICONS_REQUIREMENTS], check=True)
    stamp.touch()
    return python


class MiniconsWorker:
    """`minicons_worker.py` in the minicons venv, serving timed rounds over a pipe."""

    def __init__(self, python: Path, model: Path, texts: list[str], threads: int, variant: str, folder: Path) -> None:
        self.texts_file = folder / "texts.json"
        self.scores_file = folder / "minicons-scores.json"
        self.log_file = folder / "minicons-worker.log"
        self.texts_file.write_text(json.dumps(texts))
        command = [
            str(python),
            str(HERE / "minicons_worker.py"),
            "--model",
            str(model),
            "--texts",
            str(self.texts_file),
            "--threads",
            str(threads),
            "--pll-metric",
            MINICONS_METRIC[variant],
            "--scores",
            str(self.scores_file),
        ]
        self.log = self.log_file.open("w")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=HERE
        )
        self.machine = self._reply("ready")["machine"]

    def round(self, batch_size: int) -> float:
        self.process.stdin.write(f"round {batch_size}\n")
        self.process.stdin.flush()
        return self._reply("seconds")["seconds"]

    def close(self) -> dict[int, list[np.ndarray]]:
        """Stop the worker; the per-token log-probabilities of each batch size's last round."""
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        if self.process.wait() != 0:
            self._fail(f"exited with status {self.process.returncode}")
        self.log.close()
        scores = json.loads(self.scores_file.read_text())
        return {int(b): [np.array(s, dtype=np.float64) for s in per_text] for b, per_text in scores.items()}

    def _reply(self, key: str) -> dict:
        """The next JSON line carrying `key`; other stdout lines (library chatter) go to the log."""
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                self.log.write(line)
                continue
            if isinstance(message, dict) and key in message:
                return message
        self._fail("stopped before answering")

    def _fail(self, what: str) -> None:
        self.log.flush()
        tail = "".join(self.log_file.read_text().splitlines(keepends=True)[-20:])
        raise SystemExit(f"the minicons worker {what}; last lines of {self.log_file}:\n{tail}")


# ---------------------------------------------------------------------------------------------------
# One block of the table: a model, a length distribution, every method.


def corpus(model: str, lengths: str, sentences: int, antibody_sentences: int) -> Corpus:
    if lengths == "antibody":
        from distributed_scoring.offline.antibodies import demo_corpus

        rows = demo_corpus(per_group=-(-antibody_sentences // 3))
        return Corpus(model, lengths, [r["text"] for r in rows][:antibody_sentences])
    return Corpus(model, lengths, synthetic.sentences(sentences, lengths, seed=7))


def model_path(model: str, models_root: Path) -> Path:
    return fetch_model("antiberty") if model == "antiberty" else synthetic.model_folder(model, models_root)


def agreement(reference: list[np.ndarray], other: list[np.ndarray], name: str, texts: list[str], atol: float) -> dict:
    """Per-token and per-sentence (PLL) differences from the engine; stops the run beyond `atol`."""
    for i, (a, b) in enumerate(zip(reference, other, strict=True)):
        if len(a) != len(b):
            raise Disagreement(
                f"{name} scored {len(b)} tokens of sentence {i} where the engine scored {len(a)} "
                f"({texts[i][:60]!r}): the methods do not score the same tokens, so their speeds do not compare"
            )
    token = max(float(np.abs(a - b).max()) for a, b in zip(reference, other, strict=True))
    pll = max(abs(float(a.sum() - b.sum())) for a, b in zip(reference, other, strict=True))
    if token > atol:
        raise Disagreement(f"{name} disagrees with the engine by up to {token:.2e} per token (tolerance {atol:.0e})")
    return {"max_token_abs_diff": token, "max_pll_abs_diff": pll}


def run_block(corpus_: Corpus, path: Path, args: argparse.Namespace, minicons_python: Path | None) -> dict:
    mlm = load_masked_lm(ModelSpec(str(path), device="cpu", dtype="float32"))
    texts = corpus_.texts
    batch_tokens = args.batch_tokens or mlm.default_batch_tokens()
    ours: dict[str, Callable[[list[str]], list[np.ndarray]]] = {
        "naive-sentence": lambda t: naive(mlm, t, args.variant, per_copy=False),
        "naive-copy": lambda t: naive(mlm, t, args.variant, per_copy=True),
        "engine": lambda t: engine(mlm, t, args.variant, batch_tokens),
    }
    for budget in args.extra_budgets:
        ours[f"engine-{budget}"] = lambda t, budget=budget: engine(mlm, t, args.variant, budget)
    methods = [m for m in args.methods if m != "minicons"]
    if "minicons" in args.methods:
        methods[-1:-1] = [f"minicons-b{b}" for b in args.minicons_batch_sizes]  # before the engine
    methods[-1:-1] = [f"engine-{b}" for b in args.extra_budgets]
    for name in methods:
        if name in ours:
            ours[name](texts[:2])  # warm-up
    with tempfile.TemporaryDirectory(prefix="dscore-bench-") as tmp:
        worker = None
        if minicons_python is not None:
            worker = MiniconsWorker(minicons_python, path, texts, args.threads, args.variant, Path(tmp))
        times: dict[str, list[float]] = {m: [] for m in methods}
        scores: dict[str, list[np.ndarray]] = {}
        for r in range(args.rounds):
            for name in methods[r % len(methods) :] + methods[: r % len(methods)]:
                if name in ours:
                    seconds, scores[name] = machine.timed(lambda method=ours[name]: method(texts))
                else:
                    seconds = worker.round(int(name.removeprefix("minicons-b")))
                times[name].append(seconds)
                logger.info("%s %s round %d: %s %.2f s", corpus_.model, corpus_.lengths, r + 1, name, seconds)
        if worker is not None:
            for batch_size, per_text in worker.close().items():
                scores[f"minicons-b{batch_size}"] = per_text
    reference = scores["engine"]
    checks = {m: agreement(reference, scores[m], m, texts, args.atol) for m in methods if m != "engine"}
    n_tokens = sum(len(s) for s in reference)
    lengths = [len(s.input_ids) for s in prepared(mlm, texts)]
    return {
        "model": corpus_.model,
        "lengths": corpus_.lengths,
        "model_signature": mlm.signature,
        "sentences": len(texts),
        "scored_tokens": n_tokens,
        "mean_tokens_with_specials": float(np.mean(lengths)),
        "max_tokens_with_specials": int(max(lengths)),
        "engine_batch_tokens": batch_tokens,
        "agreement": checks,
        "methods": rates(times, len(texts), n_tokens),
        "minicons_machine": worker.machine if worker else None,
    }


def rates(times: dict[str, list[float]], n_sentences: int, n_tokens: int) -> dict[str, dict]:
    """Median rates per method, and how many times the engine's median time each method takes."""
    engine_median = statistics.median(times["engine"])
    rows = {}
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rows[name] = {
            "seconds": seconds,
            "median_s": median,
            "sentences_per_s": n_sentences / median,
            "tokens_per_s": n_tokens / median,
            "engine_speedup": median / engine_median,
        }
    return rows


# ---------------------------------------------------------------------------------------------------
# Report.


def markdown(result: dict) -> str:
    s = result["settings"]
    ours = result["machine"]
    peer = next((b["minicons_machine"] for b in result["blocks"] if b["minicons_machine"]), None)
    lines = [
        f"CPU: {ours['cpu']}, {ours['logical_cores']} logical cores; torch threads: {s['threads']} for every method.",
        f"Ours: python {ours['python']}, torch {ours['versions']['torch']}, "
        f"transformers {ours['versions']['transformers']}.",
    ]
    if peer:
        v = peer["versions"]
        lines.append(
            f"minicons env: minicons {v['minicons']}, torch {v['torch']}, transformers {v['transformers']} "
            f"({peer['dtype']}, {peer['attention']} attention)."
        )
    lines.append(
        f"Variant `{s['variant']}`; median of {s['rounds']} interleaved rounds after a warm-up; "
        f"engine budget {result['blocks'][0]['engine_batch_tokens']} tokens; tokenisation included; "
        f"1-minute load average {result['load_average'][0]:.1f} at the start, "
        f"{result['load_average'][1]:.1f} at the end."
    )
    lines += [
        "",
        "| model | lengths | sentences | scored tokens | tokens/sentence mean (max) | method | sentences/s "
        "| tokens/s | engine speed-up | max abs diff vs engine (token / PLL) |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for b in result["blocks"]:
        for name, row in b["methods"].items():
            check = b["agreement"].get(name)
            diff = f"{check['max_token_abs_diff']:.1e} / {check['max_pll_abs_diff']:.1e}" if check else "reference"
            lines.append(
                f"| {b['model']} | {b['lengths']} | {b['sentences']} | {b['scored_tokens']} | "
                f"{b['mean_tokens_with_specials']:.1f} ({b['max_tokens_with_specials']}) | {name} | "
                f"{row['sentences_per_s']:.2f} | {row['tokens_per_s']:.1f} | {row['engine_speedup']:.2f}x | {diff} |"
            )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--preset", choices=PRESETS, default="full", help="sizes: full (default) or smoke")
    parser.add_argument("--sentences", type=int, help="sentences per synthetic block (preset full: 32)")
    parser.add_argument("--antibody-sentences", type=int, help="sentences of the AntiBERTy block (full: 9)")
    parser.add_argument("--rounds", type=int, help="timed rounds per method (full: 3)")
    parser.add_argument(
        "--configs", default=",".join(f"{m}:{d}" for m, d in CONFIGS), help="comma-separated model:lengths blocks"
    )
    parser.add_argument(
        "--methods",
        default="naive-sentence,minicons,engine",
        help="comma-separated, from naive-sentence, naive-copy, minicons, engine (engine required)",
    )
    parser.add_argument(
        "--minicons-batch-sizes",
        default="8",
        help="sentences per minicons call, one row each (1 is the naive-sentence computation)",
    )
    parser.add_argument("--variant", choices=tuple(MINICONS_METRIC), default="original")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--batch-tokens", type=int, help="engine token budget (default: the engine's CPU default)")
    parser.add_argument(
        "--extra-budgets", default="4096", help="more engine budgets, one row `engine-N` each ('' for none)"
    )
    parser.add_argument("--atol", type=float, default=1e-4, help="largest per-token difference allowed")
    parser.add_argument("--minicons-venv", type=Path, default=cache_root() / "venv-minicons")
    parser.add_argument("--models-dir", type=Path, default=cache_root() / "benchmarks" / "models")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="folder for cpu-compare.json/.md")
    parser.add_argument("--update-results", type=Path, help="also write the table into this RESULTS.md")
    args = parser.parse_args()
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    args.methods = args.methods.split(",")
    args.minicons_batch_sizes = [int(b) for b in args.minicons_batch_sizes.split(",")]
    args.extra_budgets = [int(b) for b in args.extra_budgets.split(",") if b]
    if "engine" not in args.methods or args.methods[-1] != "engine":
        args.methods = [m for m in args.methods if m != "engine"] + ["engine"]
    return args


def main() -> None:
    args = parse_args()
    load_before = machine.start(args.threads)
    minicons_python = ensure_minicons_env(args.minicons_venv) if "minicons" in args.methods else None
    blocks = []
    for model, lengths in args.configs:
        path = model_path(model, args.models_dir)
        texts = corpus(model, lengths, args.sentences, args.antibody_sentences)
        blocks.append(run_block(texts, path, args, minicons_python))
    local = ("out", "update_results", "minicons_venv", "models_dir")
    settings = {k: v for k, v in vars(args).items() if k not in local}
    result = {
        "settings": {**settings, "configs": [":".join(c) for c in args.configs]},
        "machine": machine.describe(),
        "load_average": [load_before, os.getloadavg()[0]],
        "blocks": blocks,
    }
    table = markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu-compare.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / "cpu-compare.md").write_text(table)
    if args.update_results:
        update_section(args.update_results, "cpu-compare", table, "benchmarks/compare.py")
    print(table)


if __name__ == "__main__":
    main()
