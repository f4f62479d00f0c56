"""Synthetic scored rows for the audit tests, and garbage sentences for real-weight audits.

`scored_table` makes rows with the columns `dscore score --per-token` writes plus a `partition` column,
drawn so that each sentence has its own NLL level (exponential token NLLs around it). Everything is
vectorised in numpy/Arrow, so hundreds of thousands of rows take a second or two.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distributed_scoring.io import schema as S

ROWS_SCHEMA = S.output_schema(per_token=True, partition=True)
VOCAB = pa.array([f"w{i}" for i in range(500)])


def scored_table(
    rng: np.random.Generator,
    n: int,
    partition: str | None,
    nll: float = 2.0,
    spread: float = 0.2,
    lengths: tuple[int, int] = (3, 30),
    error_rate: float = 0.0,
    model: str = "tiny-bert",
    variant: str = "original",
    prefix: str = "",
) -> pa.Table:
    """`n` scored rows of one partition; sentence NLL per token ~ N(nll, spread), some rows errors."""
    error = rng.random(n) < error_rate
    n_tokens = np.where(error, 0, rng.integers(lengths[0], lengths[1] + 1, n)).astype(np.int32)
    level = np.clip(rng.normal(nll, spread, n), 0.05, None)
    token_nll = rng.exponential(np.repeat(level, n_tokens))  # (T,)
    offsets = np.concatenate([[0], np.cumsum(n_tokens)]).astype(np.int32)
    null_rows = pa.array(error)
    logprobs = pa.ListArray.from_arrays(pa.array(offsets), pa.array(-token_nll), mask=null_rows)
    tokens = pa.ListArray.from_arrays(
        pa.array(offsets), VOCAB.take(pa.array(rng.integers(0, len(VOCAB), token_nll.size))), mask=null_rows
    )
    pll = -np.bincount(np.repeat(np.arange(n), n_tokens), weights=token_nll, minlength=n)
    n_words = np.where(error, 0, np.maximum(1, n_tokens * 3 // 4)).astype(np.int32)
    with np.errstate(divide="ignore", invalid="ignore"):
        columns = {
            S.ID: [f"{prefix}{partition}:{i}" for i in range(n)],
            S.TEXT: pc.if_else(null_rows, pa.scalar("", pa.string()), pc.binary_join(tokens, " ")),
            S.PLL: pa.array(pll, mask=error),
            S.N_TOKENS: n_tokens,
            S.N_WORDS: n_words,
            S.N_UNKNOWN: np.zeros(n, np.int32),
            S.PPPL_TOKEN: pa.array(np.exp(-pll / n_tokens), mask=error),
            S.PPPL_WORD: pa.array(np.exp(-pll / n_words), mask=error),
            S.STATUS: np.where(error, S.STATUS_ERROR, S.STATUS_OK),
            S.ERROR: pa.array(np.where(error, "empty line", ""), mask=~error),
            S.MODEL: [model] * n,
            S.VARIANT: [variant] * n,
            S.TOKENS: tokens,
            S.TOKEN_LOGPROBS: logprobs,
            S.PARTITION: [partition] * n,
        }
    return pa.Table.from_pydict({k: columns[k] for k in ROWS_SCHEMA.names}, schema=ROWS_SCHEMA)


def write_rows(folder: Path, table: pa.Table, files: int, row_group_rows: int | None = None, seed: int = 0) -> Path:
    """Shuffle the rows and write them as `files` Parquet files under folder/rows, like `dscore score` does."""
    order = np.random.default_rng(seed).permutation(table.num_rows)
    table = table.take(pa.array(order))
    rows = folder / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(table.num_rows), files)):
        chunk = table.slice(int(part[0]), len(part)) if len(part) else table.slice(0, 0)
        pq.write_table(chunk, rows / f"part-{i:05d}.parquet", row_group_size=row_group_rows)
    return folder


def corrupt(text: str, rng: random.Random, kind: str = "shuffle", rate: float = 0.3) -> str:
    """A garbage version of a whitespace-separated sentence (spaced residues `E V Q L` or words).

    shuffle: the units in random order (what `antibodies.shuffled` does to residues, for any unit);
    substitute: a fraction `rate` of units replaced by random units of the same sentence;
    repeat: the first quarter repeated to the original length (too easy: the low tail).
    """
    units = text.split()
    if kind == "shuffle":
        rng.shuffle(units)
    elif kind == "substitute":
        alphabet = sorted(set(units))
        units = [rng.choice(alphabet) if rng.random() < rate else u for u in units]
    elif kind == "repeat":
        head = units[: max(1, len(units) // 4)]
        units = (head * (len(units) // len(head) + 1))[: len(units)]
    else:
        raise ValueError(f"unknown corruption {kind!r}: shuffle, substitute or repeat")
    return " ".join(units)


def mixed_corpus(clean: list[str], fraction: float, seed: int = 0, kind: str = "shuffle") -> list[dict]:
    """Rows {id, text, partition, garbage}: the clean sentences with a `fraction` of corrupted copies mixed in."""
    rng = random.Random(seed)
    rows = [{"id": f"clean:{i}", "text": t, S.PARTITION: "clean", "garbage": False} for i, t in enumerate(clean)]
    picked = rng.sample(range(len(clean)), max(1, round(fraction * len(clean))))
    rows += [
        {"id": f"{kind}:{i}", "text": corrupt(clean[i], rng, kind), S.PARTITION: "clean", "garbage": True}
        for i in picked
    ]
    rng.shuffle(rows)
    return rows
