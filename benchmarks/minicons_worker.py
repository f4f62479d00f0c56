"""minicons' MaskedLMScorer as a benchmark worker; runs in minicons' own virtual environment.

    <minicons venv>/bin/python benchmarks/minicons_worker.py --model DIR --texts FILE.json \
        --threads N --pll-metric original --scores OUT.json

Started by `compare.py`. It loads the model folder once, scores a warm-up batch, prints one JSON line
`{"ready": true, "machine": ...}`, then answers each `round B` line on stdin with one JSON line
`{"seconds": s}`: the wall time of scoring every text with `sequence_score`, B texts per call
(minicons puts all masked copies of a call's texts through one forward pass). `quit` writes the
per-token log-probabilities of each batch size's last round to --scores and exits. Only the scoring
calls are timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from machine import describe, set_threads


def per_token(scores) -> list[float]:
    """The reduction handed to `sequence_score`: keep every token's log-probability (natural log)."""
    return scores.tolist()


def score_all(scorer, texts: list[str], batch_size: int, pll_metric: str) -> list[list[float]]:
    out: list[list[float]] = []
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        out.extend(scorer.sequence_score(batch, reduction=per_token, PLL_metric=pll_metric))
    return out


def serve(scorer, texts: list[str], pll_metric: str) -> dict[int, list[list[float]]]:
    """Answer `round B` lines until `quit`; the scores of the last round of each batch size."""
    scores: dict[int, list[list[float]]] = {}
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["round"] and len(command) == 2:
            batch_size = int(command[1])
            start = time.perf_counter()
            scores[batch_size] = score_all(scorer, texts, batch_size, pll_metric)
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
        elif command == ["quit"]:
            break
        else:
            raise SystemExit(f"minicons worker: unknown command {line.strip()!r}; expected 'round B' or 'quit'")
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--texts", required=True, type=Path)
    parser.add_argument("--threads", required=True, type=int)
    parser.add_argument("--pll-metric", default="original", choices=("original", "within_word_l2r"))
    parser.add_argument("--warmup", type=int, default=2, help="texts scored once before the first round")
    parser.add_argument("--scores", required=True, type=Path)
    args = parser.parse_args()

    set_threads(args.threads)
    from minicons.scorer import MaskedLMScorer

    texts = json.loads(args.texts.read_text())
    scorer = MaskedLMScorer(args.model, device="cpu")
    score_all(scorer, texts[: args.warmup], args.warmup, args.pll_metric)
    machine = describe(("torch", "transformers", "tokenizers", "numpy", "minicons"))
    machine["attention"] = scorer.model.config._attn_implementation
    machine["dtype"] = str(next(scorer.model.parameters()).dtype).removeprefix("torch.")
    print(json.dumps({"ready": True, "machine": machine}), flush=True)
    scores = serve(scorer, texts, args.pll_metric)
    args.scores.write_text(json.dumps({str(b): s for b, s in scores.items()}))


if __name__ == "__main__":
    main()
