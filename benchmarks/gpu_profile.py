"""Where a round of `gpu_core.py` spends its GPU time: kernels by share, and the GPU's idle share.

    python benchmarks/gpu_profile.py --shape bert-base --budget 131072 --out OUT   # on a CUDA machine

One shard of synthetic sentences is scored by `PLLEngine` (bf16 autocast encoder, as gpu_core.py does),
eager and then with the encoder compiled; after a warm-up round, one round runs under torch.profiler.
Printed per mode: the round's wall time, the summed CUDA kernel time (so the idle share of the GPU:
host-bound work shows as a large one) and the top kernels by total time, grouped into matmuls,
attention, and the rest (elementwise, norms, softmax).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from distributed_scoring.config import ModelSpec  # noqa: E402
from distributed_scoring.engine.masked_lm import load_masked_lm  # noqa: E402
from distributed_scoring.engine.pll import PLLEngine  # noqa: E402
from distributed_scoring.offline.models import cache_root  # noqa: E402
from distributed_scoring.quiet import quiet_transformers  # noqa: E402

import synthetic  # noqa: E402
from gpu_core import encode  # noqa: E402

GROUPS = (
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
    ("attention", ("fmha", "flash", "attention")),
)


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, keys in GROUPS if any(k in lowered for k in keys)), "other")


def profile_round(engine: PLLEngine, sentences: list, top: int) -> str:
    engine.token_logprobs(sentences)  # warm-up (and compilation)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.token_logprobs(sentences)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.device_time_total > 0]
    busy = sum(e.device_time_total for e in kernels) / 1e6
    by_group: dict[str, float] = {}
    for e in kernels:
        by_group[group_of(e.key)] = by_group.get(group_of(e.key), 0.0) + e.device_time_total / 1e6
    lines = [
        f"wall {wall:.3f} s, kernels {busy:.3f} s (GPU idle {100 * (1 - busy / wall):.0f}%); "
        + ", ".join(f"{g} {100 * t / busy:.0f}%" for g, t in sorted(by_group.items(), key=lambda x: -x[1]))
    ]
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:top]:
        lines.append(
            f"  {100 * e.device_time_total / 1e6 / busy:5.1f}%  {e.count:6d}x  {group_of(e.key):9s} {e.key[:110]}"
        )
    return "\n".join(lines)


def time_backends(mlm, sentences: list, budget: int, rounds: int = 3) -> str:
    """Median seconds of a round with each SDPA backend forced, eager and compiled, and the largest
    per-token difference from the default backend's scores."""
    import statistics

    import numpy as np
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gpu_core import Stopwatch

    backends = {
        "default": None,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    lines, reference = [], None
    for compiled in (False, True):
        for name, backend in backends.items():
            torch._dynamo.reset()
            mlm.encoder._compiled_call_impl = None  # undo an earlier .compile()
            if compiled:
                mlm.encoder.compile(dynamic=True)
            engine = PLLEngine(mlm, "original", budget)
            context = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
            with context:
                start = time.perf_counter()
                scores = engine.token_logprobs(sentences)
                warm = time.perf_counter() - start
                seconds = []
                for _ in range(rounds):
                    with Stopwatch(torch.device("cuda")) as watch:
                        engine.token_logprobs(sentences)
                    seconds.append(watch.seconds)
            if reference is None:
                reference = scores
            diff = max(float(np.abs(a - b).max()) for a, b in zip(reference, scores))
            median = statistics.median(seconds)
            lines.append(
                f"compile={compiled} {name:9s} {median:.3f} s ({len(sentences) / median:,.0f} sentences/s), "
                f"warm-up {warm:.1f} s, max diff vs default eager {diff:.4f}"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="bert-base", choices=synthetic.SHAPES)
    parser.add_argument("--lengths", default="blimp")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--budget", type=int, default=131072)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--models-dir", type=Path, default=cache_root() / "benchmarks" / "models")
    parser.add_argument("--backends", action="store_true", help="time each SDPA backend instead of profiling")
    parser.add_argument("--out", type=Path, help="also write the printout here (profile-<shape>.txt)")
    args = parser.parse_args()
    quiet_transformers()
    folder = synthetic.model_folder(args.shape, args.models_dir)
    mlm = load_masked_lm(ModelSpec(str(folder), device="cuda", dtype="auto"))
    sentences = encode(mlm.tokenizer, synthetic.sentences(args.sentences, args.lengths, seed=7))
    report = [
        f"{args.shape} {args.lengths} {args.sentences} sentences, budget {args.budget}, "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    ]
    if args.backends:
        report.append(time_backends(mlm, sentences, args.budget))
    for mode in ("eager", "compiled") if not args.backends else ():
        if mode == "compiled":
            mlm.encoder.compile(dynamic=True)
        report += [f"{mode}:", profile_round(PLLEngine(mlm, "original", args.budget), sentences, args.top)]
    text = "\n".join(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile-{args.shape}.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
