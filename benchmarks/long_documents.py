"""An audit of a document corpus whose documents are longer than the model's window: `dscore audit`
on an embedded Ray, with `--long-texts window` (the default) and, for comparison, `--long-texts error`.

    .venv/bin/python benchmarks/long_documents.py [--documents 300] [--model DIR] [--output DIR]

The documents are 1 to 5 windows long (drawn uniformly in tokens), made of the sentences of tests/helpers/tiny.py; the
model is the tiny BERT of tests/helpers/tiny.py (96 positions, so that a CPU runs hundreds of documents in seconds)
unless --model names another. Prints one JSON line per mode: seconds, rows, windowed rows and their share as
audit.json gives them, errors, tokens scored, and the load average before the run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def documents(tokenizer, n: int, window: int, seed: int = 0) -> list[str]:
    """n documents of 1 to 5 windows' worth of tokens each (whole sentences, so a little over the draw)."""
    from helpers import tiny

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        want = rng.randint(window // 2, 5 * window)
        sentences, tokens = [], 0
        while tokens < want:
            sentence = rng.choice(tiny.CORPUS)
            sentences.append(sentence)
            tokens += len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
        out.append(" ".join(sentences))
    return out


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument(
        "--model", default=None, help="a masked-LM folder (default: the tiny BERT of tests/helpers/tiny.py)"
    )
    parser.add_argument("--output", type=Path, default=None, help="where the audits go (default: a temporary folder)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from distributed_scoring.cli import main
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.engine.model_files import load_tokenizer

    from helpers import tiny

    with tempfile.TemporaryDirectory() as name:
        folder = args.output or Path(name)
        folder.mkdir(parents=True, exist_ok=True)
        model = args.model or str(tiny.save_tiny("bert", folder / "bert"))
        _, max_length = load_tokenizer(ModelSpec(model))
        tokenizer = AutoTokenizer.from_pretrained(model)
        corpus = folder / "documents.jsonl"
        docs = documents(tokenizer, args.documents, max_length - 2)
        corpus.write_text("".join(json.dumps({"id": f"doc{i}", "text": d}) + "\n" for i, d in enumerate(docs)))
        for mode in ("window", "error"):
            out = folder / f"audit-{mode}"
            argv = ["audit", str(corpus), "--id-column", "id", "--model", model, "--output", str(out)]
            argv += ["--long-texts", mode, "--ray", "--overwrite"]
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            began = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(argv)
            seconds = time.monotonic() - began
            audit = json.loads((out / "audit.json").read_text())
            overall = audit["overall"]
            windowed = audit.get("windowed_rows")
            print(
                json.dumps(
                    {
                        "long_texts": mode,
                        "rc": rc,
                        "seconds": round(seconds, 1),
                        "documents": overall["rows"],
                        "ok": overall["ok"],
                        "errors": overall["errors"],
                        "windowed_rows": windowed,
                        "windowed_share": round(windowed / overall["ok"], 3) if windowed else None,
                        "tokens_scored": overall["n_tokens"],
                        "max_length": max_length,
                        "load_average": load,
                    }
                )
            )


if __name__ == "__main__":
    main_()
