"""Real antibody sequences for the offline demo and real-weight tests: IMGT germline V genes.

No English masked LM can be had offline, so the real-weight checks score antibody chains with antibody
MLMs. The germline genes come from the `anarci` package (fetched and cached like the models). Human
heavy chains, mouse heavy chains and shuffled human chains make three groups whose PPPLs a working
scorer must separate: human lowest, shuffled highest.
"""

from __future__ import annotations

import ast
import json
import random
import tempfile
from pathlib import Path

from ..workloads.prepare import split_characters as spaced
from .models import ANARCI, cache_root, download, extract


def germlines(cache: Path | None = None) -> dict:
    """anarci's `all_germlines` table: {segment: {chain: {species: {gene: gapped sequence}}}}."""
    root = cache or cache_root()
    cached = root / "anarci-germlines.json"
    if not cached.exists():
        with tempfile.TemporaryDirectory() as tmp:
            source = extract(download(ANARCI, root), ["anarci/germlines.py"], Path(tmp))["anarci/germlines.py"]
            tree = ast.parse(source.read_text())
        table = next(
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "all_germlines" for t in node.targets)
        )
        cached.write_text(json.dumps(table))
    return json.loads(cached.read_text())


def v_genes(species: str, chain: str = "H", cache: Path | None = None) -> dict[str, str]:
    """Ungapped germline V-gene sequences of a species and chain, one per distinct sequence, by gene name."""
    genes = germlines(cache)["V"][chain][species]
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name in sorted(genes):
        sequence = genes[name].replace("-", "")
        if sequence and sequence not in seen:
            seen.add(sequence)
            out[name] = sequence
    return out


def shuffled(sequence: str, rng: random.Random) -> str:
    residues = list(sequence)
    rng.shuffle(residues)
    return "".join(residues)


def demo_corpus(per_group: int = 12, seed: int = 0, cache: Path | None = None) -> list[dict]:
    """Rows {id, text, group}: human heavy V genes, mouse heavy V genes, and shuffled human ones."""
    rng = random.Random(seed)
    human = rng.sample(sorted(v_genes("human", cache=cache).items()), per_group)
    mouse = rng.sample(sorted(v_genes("mouse", cache=cache).items()), per_group)
    rows = [{"id": f"human:{n}", "text": spaced(s), "group": "human"} for n, s in human]
    rows += [{"id": f"mouse:{n}", "text": spaced(s), "group": "mouse"} for n, s in mouse]
    rows += [{"id": f"shuffled:{n}", "text": spaced(shuffled(s, rng)), "group": "shuffled"} for n, s in human]
    return rows
