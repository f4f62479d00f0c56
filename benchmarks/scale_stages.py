"""What the scale harness runs on workers: a no-op workload, a stage wrapper that records peak memory, and
one that holds a run at a given shard until it is killed.

The no-op workload (`noop_workload`) has the PLL workload's output schema (`schema.output_schema`) and
scores nothing: its prepare stage passes the read rows through and its score stage writes, per row, a
score that costs no model (zero, or with `scores="hash"` a fixed pseudo-random log-probability per word
so that the audit finds outliers and rescoring's tuning has something to choose). Words are whitespace
words, so `n_tokens == n_words`. Run through `pipeline.runner`, it shows the run layer's own cost:
reading, the Arrow plumbing of the stages, writing, markers, aggregation.

`PeakMemory` wraps any stage factory and, after each table, writes the process's peak resident memory
(`peak_rss_kb`) to a side folder: Ray actors are separate processes whose memory the driver cannot see.

`Holding` wraps a score stage so that the run scores a given number of shards, then stops where it stands
until it is killed: the resume measurement kills a run at half way, and a harness that polled the markers
and killed the run when it saw half of them (as it once did) could, on a busy machine, look only after the
run had marked every shard, leaving the rerun nothing to do.

Ray workers import this module by name, so `benchmarks/` must be on their PYTHONPATH (scale.py sets it
before Ray starts).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
import zlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from distributed_scoring.io import schema as S
from distributed_scoring.measures import pppl
from distributed_scoring.pipeline.stage import Row, Stage
from distributed_scoring.pipeline.workload import Workload

logger = logging.getLogger(__name__)

NOOP_MODEL = "noop"  # the `model` column and the run's model name
SCORES = ("zero", "hash")


@dataclass(frozen=True)
class NoopOptions:
    """`scores`: "zero" (every log-probability 0) or "hash" (log u per word, u uniform in (0, 1] drawn from
    the row id and `seed`: sentence NLL per token is then a mean of exponentials, long-tailed for short rows).
    `per_token` writes `tokens` and `token_logprobs` as the PLL workload's `--per-token` does."""

    scores: str = "zero"
    per_token: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.scores not in SCORES:
            raise ValueError(f"scores {self.scores!r} is not one of {SCORES}")


def word_logprobs(row_id: str, n_words: int, options: NoopOptions) -> np.ndarray:
    """(n_words,) the row's log-probabilities: zeros, or log u with u drawn from (seed, id)."""
    if options.scores == "zero":
        return np.zeros(n_words)
    rng = np.random.default_rng([options.seed, zlib.crc32(row_id.encode("utf-8"))])
    return np.log1p(-rng.random(n_words))  # log(1 - u), u in [0, 1): finite


class NoopScorer(Stage):
    """Scores nothing: each ok row gets `word_logprobs` of its whitespace words; error rows stay error rows."""

    reads = {
        S.ID: "the row's id, kept",
        S.TEXT: "the text, kept (its whitespace words are the 'tokens')",
        S.STATUS: "ok, or error for a row that could not be read (kept as an error row)",
        S.ERROR: "why the row could not be read",
    }

    def __init__(self, options: NoopOptions) -> None:
        self.options = options
        self.signature = {"scorer": "noop", "scores": options.scores, "seed": options.seed}

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return S.output_schema(self.options.per_token, False, S.PARTITION in columns)

    def process(self, rows: list[Row]) -> list[Row]:
        return [self._row(row) for row in rows]

    def _row(self, row: Row) -> Row:
        ok = row[S.STATUS] == S.STATUS_OK
        words = row[S.TEXT].split() if ok else []
        logprobs = word_logprobs(row[S.ID], len(words), self.options)
        pll = float(logprobs.sum()) if ok else None
        out = {
            **row,
            S.PLL: pll,
            S.N_TOKENS: len(words),
            S.N_WORDS: len(words),
            S.N_UNKNOWN: 0,
            S.PPPL_TOKEN: pppl(pll, len(words)) if ok else None,
            S.PPPL_WORD: pppl(pll, len(words)) if ok else None,
            S.MODEL: NOOP_MODEL,
            S.VARIANT: self.options.scores,
        }
        if self.options.per_token:
            out[S.TOKENS] = words if ok else None
            out[S.TOKEN_LOGPROBS] = logprobs.tolist() if ok else None
        return out


def passthrough(table: pa.Table) -> pa.Table:
    """The no-op prepare stage: the read rows as they are."""
    return table


def passthrough_preparer() -> Callable[[pa.Table], pa.Table]:
    return passthrough


def noop_workload(options: NoopOptions = NoopOptions()) -> Workload:
    """The no-op workload: read -> pass through -> `NoopScorer` -> write, on CPU."""
    return Workload("noop", options, passthrough_preparer, partial(NoopScorer, options), "cpu")


class PeakMemory:
    """A stage (built by `make`) that, after each table, records this process's peak RSS (`peak_rss_kb`) in
    `folder/<role>-<pid>.json`; `signature` is the wrapped stage's, if it has one."""

    def __init__(self, make: Callable[[], Any], role: str, folder: str) -> None:
        self.stage = make()
        self.role, self.folder = role, folder
        self.tables = 0
        if hasattr(self.stage, "signature"):
            self.signature = self.stage.signature

    def __call__(self, table: pa.Table, *args: Any) -> pa.Table:
        out = self.stage(table, *args)
        self.tables += 1
        record = {"role": self.role, "pid": os.getpid(), "tables": self.tables, "maxrss_kb": peak_rss_kb()}
        path = os.path.join(self.folder, f"{self.role}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        return out


def peak_rss_kb() -> int:
    """This process's peak resident set size so far, in KiB: Linux's VmHWM, the high-water mark of this
    process's own address space. Not ru_maxrss: Linux carries that across exec, so a child started by a
    large parent would report the parent's size."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def recorded(workload: Workload, folder: str) -> Workload:
    """`workload` with both stages wrapped in `PeakMemory` (roles `prepare` and `score`); same name and
    options, so the run's fingerprint is the workload's own."""
    return Workload(
        workload.name,
        workload.options,
        partial(PeakMemory, workload.make_preparer, "prepare", folder),
        partial(PeakMemory, workload.make_scorer, "score", folder),
        workload.device,
        workload.rows_per_input,
    )


def actor_peaks(folder: str, exclude_pid: int) -> dict[str, int]:
    """The largest recorded peak RSS (KiB) per role, over processes other than `exclude_pid` (the driver)."""
    peaks: dict[str, int] = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            if record["pid"] != exclude_pid:
                peaks[record["role"]] = max(peaks.get(record["role"], 0), record["maxrss_kb"])
    return peaks


class Holding:
    """A score stage (built by `make`) that lets the run score `shards` tables in all, over every process
    of the run, and holds on the next one until its process is killed. Each table takes a slot first, a
    file `folder/slot-<i>` created exclusively, so that scoring actors in separate processes count
    together; in process, where shards are written one after another, exactly `shards` are marked when it
    holds (on Ray, those already scored may still be written)."""

    def __init__(self, make: Callable[[], Any], shards: int, folder: str) -> None:
        self.stage = make()
        self.shards, self.folder = shards, folder
        if hasattr(self.stage, "signature"):
            self.signature = self.stage.signature

    def __call__(self, table: pa.Table, *args: Any) -> pa.Table:
        if not self._take_slot():
            logger.info("holding after %d shards scored, until this run is killed", self.shards)
            while True:
                time.sleep(60)
        return self.stage(table, *args)

    def _take_slot(self) -> bool:
        os.makedirs(self.folder, exist_ok=True)
        for i in range(self.shards):
            try:
                os.close(os.open(os.path.join(self.folder, f"slot-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            return True
        return False


def holding(workload: Workload, shards: int, folder: str) -> Workload:
    """`workload` whose score stage holds after `shards` shards (`Holding`, its slots in `folder`); same name
    and options, so that a rerun without the hold resumes its folder."""
    return replace(workload, make_scorer=partial(Holding, workload.make_scorer, shards, folder))
