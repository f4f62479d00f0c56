"""A simulated series of nightly snapshots from real antibody chains (IMGT germline V genes, as the demo
scores them), with injected events: a one-night junk spike, a partition that vanishes and returns, a tail of
junk that grows while typical rows get easier (flat PPPL), a slow creep. Each night is one text file per
partition; `Plan.night(k)` says which chains it holds.

The chains are scored once first (`pool_scores`), so that the creep's nightly steps and the flat PPPL of the
shape event are designed on the model's own scores, not hoped for.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from distributed_scoring.cli import main
from distributed_scoring.offline.antibodies import spaced, v_genes

from helpers.audit import corrupt

RESIDUES = 40  # the first residues of each gene: 110 distinct human and 302 mouse chains, fast on two cores
CREEP = 0.015  # PPPL rise a night of the creep: 1.5 %, each step well under the 5 % threshold
MUTATIONS = 4  # a creeping row takes up to this many point substitutions, one more a step at most
_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"


def chains(species: str) -> list[str]:
    """The species' germline V genes' first residues, spaced, each once, in a fixed order."""
    seen = dict.fromkeys(spaced(g[:RESIDUES]) for g in sorted(v_genes(species).values()) if len(g) >= RESIDUES)
    return list(seen)


def write_night(folder: Path, partitions: dict[str, list[str]]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, lines in partitions.items():
        path = folder / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def pool_scores(model: str, texts: list[str], folder: Path) -> dict[str, float]:
    """NLL per token of each distinct text, scored once with `dscore score`."""
    unique = sorted(set(texts))
    path = folder / "pool.txt"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(unique) + "\n")
    assert main(["score", str(path), "--model", model, "--output", str(folder / "scored"), "--overwrite"]) == 0
    rows = pq.read_table(folder / "scored" / "rows", columns=["text", "pll", "n_tokens"]).to_pylist()
    return {r["text"]: -r["pll"] / r["n_tokens"] for r in rows}


@dataclass
class Plan:
    """Which chains each night holds. Partitions: `human` (70 rows), `human_b` (12) and `mouse` (150); a quiet
    night replaces a tenth of each partition's rows with other genes of the same species (seeded per night)."""

    human: list[str]
    mouse: list[str]
    nll: dict[str, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.human_base, self.human_b, self.human_spare = self.human[:70], self.human[70:82], self.human[82:]
        self.mouse_base, self.mouse_spare = self.mouse[:150], self.mouse[150:260]
        self.junk = [corrupt(c, rng, "shuffle") for c in self.human_base[:30]]
        self.mouse_junk = [corrupt(c, rng, "shuffle") for c in self.mouse_base]
        self.mutants = [_mutants(c, rng) for c in self.mouse_base]  # per row: 0..MUTATIONS substitutions

    def texts(self) -> list[str]:
        return [*self.human, *self.mouse[:260], *self.junk, *self.mouse_junk, *(m for row in self.mutants for m in row)]

    def churn(self, rows: list[str], spare: list[str], night: int, salt: int) -> list[str]:
        rng = random.Random(self.seed * 1000 + night * 10 + salt)
        rows = list(rows)
        for i in rng.sample(range(len(rows)), len(rows) // 10):
            rows[i] = rng.choice(spare)
        return rows

    def steady(self) -> dict[str, list[str]]:
        """The partitions' base rows, unchurned: the same texts under the same ids every such night."""
        return {"human": list(self.human_base), "human_b": list(self.human_b), "mouse": list(self.mouse_base)}

    def quiet(self, night: int) -> dict[str, list[str]]:
        return {
            "human": self.churn(self.human_base, self.human_spare, night, 1),
            "human_b": self.churn(self.human_b, self.human_spare, night, 2),
            "mouse": self.churn(self.mouse_base, self.mouse_spare, night, 3),
        }

    def spike(self, night: int) -> dict[str, list[str]]:
        """A quarter of the human rows junk for one night."""
        parts = self.quiet(night)
        parts["human"][:20] = self.junk[:20]
        return parts

    def vanished(self, night: int) -> dict[str, list[str]]:
        parts = self.quiet(night)
        del parts["human_b"]
        return parts

    def base_pppl(self, partition: str) -> float:
        """The PPPL of a partition's base rows (equal lengths: the mean NLL per token)."""
        rows = {"human": self.human_base, "mouse": self.mouse_base}[partition]
        return float(np.exp(np.mean([self.nll[t] for t in rows])))

    def creep(self, night: int, step: int) -> dict[str, list[str]]:
        """The mouse partition's PPPL `step` x 1.5 % above its base, spread over its rows: row after row (the
        same order every night) takes one more point substitution until the designed level is reached, so
        every night changes many rows a little (a corpus getting harder, not a few rows of junk) and the rows
        keep their ids (the baseline pairs them)."""
        parts = self.steady()
        level = [0] * len(self.mouse_base)
        total = sum(self.nll[t] for t in self.mouse_base)
        target = total + len(level) * np.log1p(CREEP) * step  # sum of per-row NLL per token (equal lengths)
        for _ in range(MUTATIONS):
            for i, row in enumerate(self.mutants):
                if total >= target:
                    break
                total += self.nll[row[level[i] + 1]] - self.nll[row[level[i]]]
                level[i] += 1
        parts["mouse"] = [row[k] for row, k in zip(self.mutants, level)]
        return parts

    def tail(self, night: int, step: int) -> dict[str, list[str]]:
        """`6 step` mouse rows junk (shuffled), and as many others replaced by the easiest chains of the night
        (human germline genes, which this human-heavy-chain model finds easiest) as keep the partition's PPPL
        where it was: a tail that grows while the typical rows get easier, the PPPL flat."""
        parts = self.quiet(night)
        rows = list(self.mouse_base)
        total = sum(self.nll[t] for t in rows)
        junk = 6 * step
        rows[:junk] = self.mouse_junk[:junk]
        easy = sorted(self.human, key=self.nll.__getitem__)[:5]
        by_difficulty = sorted(range(junk, len(rows)), key=lambda i: -self.nll[rows[i]])
        level = sum(self.nll[t] for t in rows)
        for k, i in enumerate(by_difficulty):
            if level <= total:
                break
            replacement = easy[k % len(easy)]
            level += self.nll[replacement] - self.nll[rows[i]]
            rows[i] = replacement
        parts["mouse"] = rows
        return parts


def _mutants(chain: str, rng: random.Random) -> list[str]:
    """The chain with 0, 1, ... MUTATIONS point substitutions, each version one more than the last."""
    units = chain.split()
    versions = [chain]
    for position in rng.sample(range(len(units)), MUTATIONS):
        units[position] = rng.choice(_RESIDUES.replace(units[position], ""))
        versions.append(" ".join(units))
    return versions


def night_label(k: int) -> str:
    return f"2026-01-{k:02d}" if k <= 31 else f"2026-02-{k - 31:02d}"


def audit_json(folder: Path) -> dict:
    return json.loads((folder / "audit.json").read_text())
