"""First speed figure: the engine against naive PLL scoring, same sentences, same model, one process.

    python benchmarks/speed_vs_naive.py [--sentences 48] [--rounds 3]

Model: BERT-base shape (12 layers, hidden 768, vocabulary 30,522), random weights. Sentences:
BLiMP-like lengths (8-25 pseudo-words). Methods:
  naive-copy      one masked copy per forward pass, full logits (the test suite's reference method)
  naive-sentence  all copies of one sentence in one forward pass, full logits (the common approach)
  engine          distributed_scoring's PLLEngine (packed batches, head on masked rows only)
All three must agree on every token's log-probability (checked here) before any rate is printed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from distributed_scoring.masking import Sentence
from distributed_scoring.models import MaskedLM
from distributed_scoring.pll import PLLEngine
from distributed_scoring.prepare import Preparer

import synthetic


@torch.inference_mode()
def naive(model, sentences: list[Sentence], mask_id: int, per_copy: bool) -> list[np.ndarray]:
    out = []
    for s in sentences:
        ids = torch.from_numpy(s.input_ids)
        copies = ids.repeat(len(s.targets), 1)  # (n, L)
        copies[torch.arange(len(s.targets)), torch.from_numpy(s.targets)] = mask_id
        chunks = copies.split(1) if per_copy else [copies]
        logits = torch.cat([model(input_ids=c).logits for c in chunks])  # (n, L, V)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        rows = torch.arange(len(s.targets))
        out.append(logprobs[rows, s.targets, ids[s.targets]].double().numpy())
    return out


def bert_base(tokenizer) -> MaskedLM:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer))).eval()
    return MaskedLM(model, tokenizer, torch.device("cpu"), None, torch.float32, 512,
                    model.cls, {"model": "bert-base-shaped (random)"})


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-tokens", type=int, default=1024)
    args = parser.parse_args()

    tokenizer = synthetic.bert_tokenizer()
    mlm = bert_base(tokenizer)
    texts = synthetic.sentences(args.sentences, "blimp", seed=7)
    prepared = Preparer(tokenizer, mlm.max_length).prepare_texts(texts)
    sents = [Sentence(np.array(p.input_ids), np.array(p.targets), np.array(p.piece_words)) for p in prepared]
    n_tokens = sum(len(s.targets) for s in sents)
    engine = PLLEngine(mlm, "original", args.batch_tokens)
    methods = {
        "naive-copy": lambda: naive(mlm.model, sents, mlm.mask_token_id, per_copy=True),
        "naive-sentence": lambda: naive(mlm.model, sents, mlm.mask_token_id, per_copy=False),
        "engine": lambda: engine.token_logprobs(sents),
    }
    engine.token_logprobs(sents[:2])  # warm-up
    times: dict[str, list[float]] = {m: [] for m in methods}
    results = {}
    for _ in range(args.rounds):
        for name, fn in methods.items():
            seconds, results[name] = timed(fn)
            times[name].append(seconds)
    worst = max(np.abs(a - b).max() for name in methods for a, b in zip(results[name], results["engine"]))
    assert worst < 1e-4, f"methods disagree by {worst}"

    print(f"device: CPU ({cpu_name()}), {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    print(f"model: BERT-base shape, random weights; {len(sents)} sentences, {n_tokens} scored tokens "
          f"(mean {n_tokens / len(sents):.1f} tokens/sentence); budget {args.batch_tokens} tokens; "
          f"median of {args.rounds} rounds; max disagreement {worst:.1e}")
    engine_rate = len(sents) / statistics.median(times["engine"])
    print(f"{'method':<16} {'sentences/s':>12} {'tokens/s':>10} {'engine speed-up':>16}")
    for name in methods:
        median = statistics.median(times[name])
        rate = len(sents) / median
        print(f"{name:<16} {rate:>12.2f} {n_tokens / median:>10.1f} {engine_rate / rate:>15.2f}x")


if __name__ == "__main__":
    main()
