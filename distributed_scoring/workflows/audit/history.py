"""The history of nightly audits (`dscore audit --history HIST`): a Parquet dataset, one file per night.

`HIST/<night>.parquet` holds one row per scope of that night (`HISTORY_SCHEMA`; docs/audit.md lists the
columns), so pandas, pyarrow and DuckDB read the folder as one table (`pd.read_parquet(HIST)`,
`read_parquet('HIST/*.parquet')`), and the night's label is a column of every row. A night is written whole
in one request (a hidden temporary file and a rename locally, one PUT on S3): rerunning or resuming a
night replaces its file, so a night is there exactly once, and a kill leaves at most a hidden temporary
file that no reader sees. Appends hold `HIST/_lock.json`, the run folders' lock (`io.lock`): two audits
never write at once; the second waits for the first (`LOCK_WAIT_S`), a killed holder's lock is taken over
as a run folder's is.

Nights are ordered by their labels' natural order (digit runs compared as numbers): ISO dates, the default
(`--night`, the UTC date of the run), and labels such as night-9 < night-10 sort as time does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import UserError
from ...io import schema as S
from ...io.lock import FolderLock, FolderLockedError
from ...io.output import OutputDir
from ...io.storage import storage_error
from .series import Night

__all__ = [
    "CANARY",
    "HISTORY_SCHEMA",
    "History",
    "QUANTILES",
    "check_night",
    "night_key",
    "scope_night",
]

logger = logging.getLogger(__name__)

LOCK_WAIT_S = 120.0  # how long an append waits for another audit's append to the same history
_POLL_S = 0.5
CANARY = "(canary)"  # the canary's scope: its rows are never in the corpus figures
QUANTILES = (0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)  # of per-row NLL per token
QUANTILE_COLUMNS = tuple(f"nll_q{round(q * 100):02d}" for q in QUANTILES)
_NIGHT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_RULES = ("rolling", "drift", "shape")

HISTORY_SCHEMA = pa.schema(
    [
        ("night", pa.string()),  # the night's label
        ("created", pa.string()),  # when the audit ran, ISO 8601 UTC
        ("segment", pa.string()),  # the first night of this night's segment (the same scorer since)
        ("scorer", pa.string()),  # digest of the scorer's identity (weights included); a change starts a segment
        ("scorer_signature", pa.string()),  # that identity, as JSON
        ("input_fingerprint", pa.string()),  # digest of the snapshot's files (names, sizes, mtimes)
        ("metric", pa.string()),  # the PPPL the verdicts judge by
        ("scope", pa.string()),  # (overall), a partition, or (canary)
        ("event", pa.string()),  # new / vanished / returned partition, scorer changed; null on a plain night
        ("rows", pa.int64()),
        ("ok", pa.int64()),
        ("errors", pa.int64()),
        ("sum_pll", pa.float64()),
        ("n_tokens", pa.int64()),
        ("n_words", pa.int64()),
        ("pppl_token", pa.float64()),
        ("pppl_word", pa.float64()),
        ("error_rate", pa.float64()),
        ("log_pppl_se", pa.float64()),  # standard error of log PPPL (the metric's) from the rows
        *((name, pa.float64()) for name in QUANTILE_COLUMNS),
        ("histogram", pa.list_(pa.int64())),  # audit.json's bins: underflow, the bins, overflow
        ("outliers", pa.int64()),
        ("outlier_median", pa.float64()),  # the outlier rule's median and measured sigma of the scope's own rows:
        ("outlier_sigma", pa.float64()),  # what later nights' cutoffs are made of (`nightly.series_cutoffs`)
        *((rule, pa.string()) for rule in _RULES),  # each rule's status tonight
        ("series_status", pa.string()),  # the scope's worst
        ("reference_pppl", pa.float64()),  # the rolling reference (median of the window)
        ("pppl_band", pa.float64()),  # the relative PPPL change that counts as none (max_pppl_increase)
        ("rolling_ratio", pa.float64()),
        ("tail_share", pa.float64()),  # share of rows above the reference's 90th percentile
        ("head_share", pa.float64()),
        ("psi", pa.float64()),
        ("verdict", pa.string()),  # the night's, and its exit code
        ("exit_code", pa.int32()),
        ("canary_ids", pa.list_(pa.string())),  # on the (canary) row: its texts' ids and PLLs
        ("canary_pll", pa.list_(pa.float64())),
        ("canary_tokens", pa.list_(pa.int64())),
    ]
)


def night_key(label: str) -> tuple:
    """Natural order: digit runs as numbers, so night-9 < night-10 and ISO dates in time order."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.findall(r"\d+|\D+", label))


def check_night(label: str) -> str:
    """A night's label names its file: letters, digits, '.', '_' and '-' only."""
    if not _NIGHT.fullmatch(label):
        raise UserError(
            f"night {label!r}: a night's label names a file of the history, so it takes letters, digits, '.', "
            "'_' and '-' only (up to 100, starting with a letter or digit), e.g. 2026-12-07"
        )
    return label


@dataclass(frozen=True)
class History:
    """The history at `uri` (a folder or an s3:// prefix)."""

    uri: str

    @property
    def out(self) -> OutputDir:
        return OutputDir(self.uri)

    def nights(self) -> list[str]:
        """Every night's label, in order."""
        out = self.out
        try:
            paths = out.files("", ".parquet")
        except OSError as exc:
            raise storage_error(self.uri, exc, "list the history") from exc
        labels = [p.rsplit("/", 1)[-1].removesuffix(".parquet") for p in paths]
        return sorted((n for n in labels if not n.startswith((".", "_"))), key=night_key)

    def read(self, night: str, columns: list[str] | None = None) -> pa.Table:
        out = self.out
        try:
            return pq.read_table(out.path(f"{night}.parquet"), filesystem=out.fs, columns=columns)
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(
                f"{self.uri}: the night {night!r} cannot be read ({exc}); move that file aside (it is one night's "
                "rows) and rerun"
            ) from exc

    def before(self, night: str) -> list[str]:
        key = night_key(night)
        return [n for n in self.nights() if night_key(n) < key]

    def append(self, night: str, table: pa.Table) -> None:
        """Write the night's rows, replacing an earlier write of the same night, under the history's lock."""
        table = table.cast(HISTORY_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        out = self.out
        with self._locked():
            try:
                out.write_bytes(f"{night}.parquet", sink.getvalue())
            except OSError as exc:
                raise storage_error(self.uri, exc, "append to the history") from exc
        logger.info("history %s: night %s written (%d scopes)", self.uri, night, table.num_rows)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[FolderLock]:
        """Hold the history's lock, waiting up to `LOCK_WAIT_S` for another audit's append to end."""
        deadline = time.monotonic() + LOCK_WAIT_S
        said = False
        while True:
            lock = FolderLock(self.out)
            try:
                lock.acquire()
                break
            except FolderLockedError as exc:
                if time.monotonic() > deadline:
                    raise FolderLockedError(f"the history {exc}") from exc
                if not said:
                    logger.info("the history %s is being written by another audit; waiting for it", self.uri)
                    said = True
                time.sleep(_POLL_S)
        try:
            yield lock
        finally:
            lock.release()


def scope_night(row: dict, metric: str) -> Night:
    """A history row (as a dict) as the series judges it."""
    pppl = row.get(metric)
    histogram = row.get("histogram")
    return Night(
        row["night"],
        int(row.get("rows") or 0),
        int(row.get("errors") or 0),
        None if pppl is None or not pppl > 0 else float(np.log(pppl)),
        row.get("log_pppl_se"),
        row.get("nll_q10"),
        row.get("nll_q90"),
        tuple(histogram) if histogram else (),
    )


def figures_of_rows(nll: np.ndarray, tokens: np.ndarray, words: np.ndarray, metric: str) -> tuple[np.ndarray, dict]:
    """Of one scope's ok rows: the NLL per token of those with tokens (what the shape rule reads), and the
    quantiles of it and the standard error of log PPPL (delta method over rows), as the history keeps them."""
    scored = tokens > 0
    per_token = nll[scored] / tokens[scored]
    quantiles = np.quantile(per_token, QUANTILES) if per_token.size else [None] * len(QUANTILES)
    denominator = tokens if metric == S.PPPL_TOKEN else words
    se = None
    if denominator.size > 1 and denominator.sum() > 0:
        ratio = nll.sum() / denominator.sum()
        influence = (nll - ratio * denominator) / denominator.mean()
        se = float(np.sqrt(np.var(influence, ddof=1) / denominator.size))
    figures = {**dict(zip(QUANTILE_COLUMNS, (None if q is None else float(q) for q in quantiles))), "log_pppl_se": se}
    return per_token, figures


def signature_json(identity: dict) -> str:
    return json.dumps(identity, sort_keys=True, default=str)
