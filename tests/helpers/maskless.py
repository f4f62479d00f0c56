"""The distillation corpus the maskless tests train on: parents and their point mutants, by id."""

from __future__ import annotations

import json
import random
from pathlib import Path

from helpers import tiny


def write_family_corpus(path: Path, parents: int = 12, mutants: int = 2, seed: int = 0) -> Path:
    """Parents of tiny-corpus words (ids p<i>) and their one-word substitutions (ids p<i>~m<j>)."""
    rng = random.Random(seed)
    words = " ".join(tiny.CORPUS).split()
    rows = []
    for i in range(parents):
        parent = [rng.choice(words) for _ in range(rng.randint(4, 12))]
        rows.append({"id": f"p{i}", "text": " ".join(parent)})
        for j in range(1, mutants + 1):
            child = list(parent)
            child[rng.randrange(len(child))] = rng.choice(words)
            rows.append({"id": f"p{i}~m{j}", "text": " ".join(child)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
