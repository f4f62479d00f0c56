"""A case of the adversarial trial, the categories it falls in, what the cases expect, and the inputs they
write. Each case works in a folder of its own (`<root>/<case id>/`) beside the trial's tiny models
(`<root>/_models/bert`, `.../roberta`: built by tests/helpers/tiny.py, nothing downloaded)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from helpers import tiny
from helpers.trial.judge import Outcome, Trial

BAD_INPUT, FAULT, MISTAKE, ATTACK = "bad input", "fault", "operator mistake", "attack"
STOP = "stop and check"  # signals, models found unusable, the machine's limits
CATEGORIES = (BAD_INPUT, FAULT, MISTAKE, ATTACK, STOP)

REFUSED_LINE = "exit 2, one line, no traceback, nothing written"
ROWS_LINE = "exit 0, rows in == rows out, an error row per bad row, verify OK"
CLEAR_LINE = "exit 2 in one line, or exit 0 with rows in == rows out and verify OK"

Run = Callable[[Trial, Path], Outcome]


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    what: str
    expected: str
    run: Run
    ray: bool = False  # starts an embedded Ray (`--ray`)


class Cases(list):
    """The cases of one category, in the order the trial plays them and its table shows them."""

    def __init__(self, category: str) -> None:
        super().__init__()
        self.category = category

    def add(self, id: str, what: str, expected: str, ray: bool = False) -> Callable[[Run], Run]:
        """Decorates the function that plays case `id`: `what` is done, `expected` is what docs/runs.md promises."""

        def register(fn: Run) -> Run:
            assert all(c.id != id for c in self), f"case {id} twice"
            self.append(Case(id, self.category, what, expected, fn, ray))
            return fn

        return register


# Inputs

M, R = "../_models/bert", "../_models/roberta"  # each case runs in <root>/<case id>/
CORPUS_LINES = 12
KILL_LINES = 24  # twelve shards of 2 rows: the kill falls mid-run
MASKED = [
    "the quick brown [MASK] jumps",
    "she sells [MASK] by the seashore",
    "a [MASK] dog",
    "colourless green [MASK] sleep furiously",
]


def write(d: Path, name: str, text: str | bytes) -> str:
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return name


def jsonl(d: Path, name: str, records: Sequence[object]) -> str:
    return write(d, name, "".join(json.dumps(r) + "\n" for r in records))


def corpus(d: Path, n: int = CORPUS_LINES, name: str = "c.txt") -> str:
    return write(d, name, "".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(n)))


def parquet(d: Path, name: str, columns: dict[str, list]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), d / name, row_group_size=2)
    return name


def nbest(d: Path, name: str, utterances: int = 3, hyps: int = 2, prefix: str = "u") -> str:
    records = [
        {
            "utt_id": f"{prefix}{u}",
            "hyp_id": h,
            "text": tiny.CORPUS[(u * hyps + h) % len(tiny.CORPUS)],
            "score": -1.0 * h - u / 10,
            "ref": tiny.CORPUS[(u * hyps + 1) % len(tiny.CORPUS)],
        }
        for u in range(1, utterances + 1)
        for h in range(1, hyps + 1)
    ]
    return jsonl(d, name, records)


def masked(d: Path, name: str = "m.jsonl", rows: Sequence[tuple[str, str | None]] | None = None) -> str:
    rows = rows if rows is not None else [(f"r{i}", text) for i, text in enumerate(MASKED)]
    return jsonl(d, name, [{"id": i, "text": t} for i, t in rows])


def distinct_texts(d: Path, *sources: str) -> int:
    """The rows of a rescore's MLM run: each distinct hypothesis text of its N-best lists once."""
    return len({json.loads(line)["text"] for s in sources for line in (d / s).read_text().splitlines()})


def score_argv(source: str, *extra: str, out: str = "out") -> list[str]:
    """`dscore score` of `source` with the tiny BERT in shards of 2 rows."""
    return ["score", source, "--model", M, "--output", out, "--shard-rows", "2", *extra]


def rescore_argv(d: Path, utterances: int, hyps: int, out: str = "out", name: str = "") -> list[str]:
    """`dscore rescore` of a dev and a test N-best list written for it (`{name}_dev.jsonl`, utterance ids
    `{name}d1`, ...), with the tiny BERT in shards of 2 rows; its --dev and --test files at argv[2] and [4]."""
    files = f"{name}_" if name else ""
    dev = nbest(d, f"{files}dev.jsonl", utterances, hyps, f"{name}d")
    test = nbest(d, f"{files}test.jsonl", utterances, hyps, f"{name}t")
    return ["rescore", "--dev", dev, "--test", test, "--model", M, "--output", out, "--shard-rows", "2"]
