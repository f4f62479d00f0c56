"""The audit's outliers: a robust rule on NLL per token, and the flagged rows written to `outliers.parquet`.

Outliers follow a robust rule on x = NLL per token = -PLL / n_tokens of each scored sentence:
z = (x - median) / sigma with sigma = 1.4826 * MAD (the normal-consistent MAD; 1.2533 * mean absolute
deviation when the MAD is 0, after Iglewicz & Hoaglin), flagged when z > k (and z < -k with `low_tail`).
Sigma is floored at `min_sigma` nats per token: a partition of near-identical sentences (germline genes of
one species) measures a sigma of a few thousandths, against which a sentence 4.3 nats per token above its
median reads z = +867; with the floor of 0.05 it reads +87, still far beyond k, in units one can weigh.

The audit's first pass keeps one NLL and one partition code per sentence (`ScannedRows`); the rule is
applied to those, and a second pass opens only the files and row groups holding flagged sentences to
write their text and tokens to `outliers.parquet`, so a clean corpus costs nothing more. Whatever the
rule's scope, the highest rows by the rule of each scope (one for the corpus, one per partition) are listed
too, flagged or not, each marked, for the report: that pass also reads those few.

Rows made mostly of the tokenizer's unknown token (over `MOSTLY_UNKNOWN` of their scored tokens, the rule
summary.json's `mostly_unknown_rows` counts by) are a category of their own: their PLL measures how the model
predicts its unknown token, not the text, so they are kept out of the rule (neither flagged nor part of the
median and MAD, which a handful of them would widen until they hide everything else) and counted and listed
apart, under `unknown_tokens`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import UserError
from ...io import schema as S
from ...io.output import MOSTLY_UNKNOWN
from ...options import ADDED_LATER, check, option
from .verdicts import OVERALL

__all__ = [
    "BASELINE",
    "SERIES",
    "Cutoff",
    "OutlierRule",
    "ScannedRows",
    "reference_cutoff",
    "robust_cutoff",
    "scope_cutoffs",
    "mostly_unknown",
    "write_outliers",
    "NLL_PER_TOKEN",
    "ROBUST_Z",
    "TAIL",
    "OUTLIERS_FILE",
    "OUTLIER_SCHEMA",
]

OUTLIERS_FILE = "outliers.parquet"
NLL_PER_TOKEN = "nll_per_token"
UNKNOWN_SHARE = "unknown_share"
ROBUST_Z = "robust_z"
TAIL = "tail"

SCOPES = ("overall", "partition")
BASELINE = "baseline"  # a cutoff's `source` when it is the baseline's
SERIES = "series"  # a cutoff's `source` when it comes from the history's reference nights (`nightly.series_cutoffs`)
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
_MEAN_AD_TO_SIGMA = 1.2533  # the same for the mean absolute deviation (used when the MAD is 0)
_SIGMA = "1.4826 * MAD (1.2533 * mean absolute deviation where the MAD is 0), at least min_sigma"
_LISTED_TEXT_CHARS = 500  # text kept per listed sentence in audit.json; outliers.parquet has it whole

OUTLIER_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.PARTITION, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(S.PLL, pa.float64()),
        pa.field(S.N_TOKENS, pa.int32()),
        pa.field(S.N_WORDS, pa.int32()),
        pa.field(NLL_PER_TOKEN, pa.float64()),
        pa.field(S.PPPL_TOKEN, pa.float64()),
        pa.field(ROBUST_Z, pa.float64()),
        pa.field(TAIL, pa.string()),  # "high" (harder than the rest) or "low" (suspiciously easy)
        pa.field(S.TOKENS, pa.list_(pa.string())),  # null when the rows were scored without --per-token
        pa.field(S.TOKEN_LOGPROBS, pa.list_(pa.float64())),
    ]
)
_COLUMNS = [S.ID, S.TEXT, S.PLL, S.N_TOKENS, S.N_WORDS, S.N_UNKNOWN, S.TOKENS, S.TOKEN_LOGPROBS]  # the second pass's


@dataclass(frozen=True)
class OutlierRule:
    """Which sentences are flagged: robust z of NLL per token beyond `k`.

    k = 3.5 is Iglewicz & Hoaglin's cut for the modified z-score. `low_tail` also flags sentences that
    are far too easy (boilerplate, repeats). Sentences with fewer than `min_tokens` scored tokens are
    never flagged (their NLL per token is too noisy). `scope="partition"` (the default) takes median and
    MAD within each partition, since partitions (sources, domains, species) differ in PPPL by design and
    one corpus-wide rule flags a whole harder partition; `scope="overall"` is one rule for the corpus.
    Rows without a partition form one partition, so an unpartitioned corpus gets one rule either way.
    The fields but `min_tokens` declare their flags (`dscore audit`'s).
    """

    k: float = option(
        3.5,
        "flag sentences whose NLL/token is over median + k robust sigmas (default {default})",
        low=0,
        above=True,
        name="--outlier-k",
    )
    low_tail: bool = option(False, "also flag sentences far below the median NLL/token")
    min_tokens: int = 1
    scope: str = option(
        "partition",
        "one outlier rule per partition (default), or one for the whole corpus",
        choices=SCOPES,
        name="--outlier-scope",
    )
    min_sigma: float = option(  # nats per token: the smallest spread the rule assumes (see the module's docstring)
        0.05,
        "the smallest robust sigma, in nats per token, the outlier rule divides by (default {default:g}; 0 for "
        "none): a partition of near-identical sentences measures a tiny one",
        low=0,
        name="--outlier-min-sigma",
    )

    def __post_init__(self) -> None:
        check(self)
        if self.min_tokens < 1:
            raise UserError(f"outlier min_tokens must be at least 1, got {self.min_tokens}")


@dataclass(frozen=True)
class Cutoff:
    """Robust centre and spread of NLL per token, and the flagging bounds they give (NLL units): `sigma` is
    the spread the rule uses, `measured_sigma` the one measured (smaller when the floor applies); `source`
    says whose median and spread they are: `BASELINE` the baseline's, `SERIES` those of the history's
    reference `nights`, None this audit's own rows."""

    median: float
    sigma: float
    high: float
    low: float | None
    measured_sigma: float | None = field(default=None, metadata=ADDED_LATER)
    source: str | None = field(default=None, metadata=ADDED_LATER)
    nights: list[str] | None = field(default=None, metadata=ADDED_LATER)

    def z(self, values: np.ndarray) -> np.ndarray:
        if self.sigma == 0:
            return np.where(np.isnan(values), np.nan, 0.0)
        return (values - self.median) / self.sigma


@dataclass(frozen=True, eq=False)
class ScannedRows:
    """Every scanned row, in file order, as the rule sees it, and where to read it again.

    A row's index counts rows across `files` in order; `file_rows` holds each file's row count, so an
    index finds its file. `codes` index `partitions` (the names, nulls already named by the scan).
    """

    nll: np.ndarray  # (N,) float64 NLL per token, NaN where the row cannot be flagged (mostly unknown included)
    unknown: np.ndarray  # (K,) int64 sorted indices of the rows mostly of unknown tokens (`mostly_unknown`)
    codes: np.ndarray  # (N,) int32 partition code
    partitions: list[str]
    fs: pafs.FileSystem
    files: list[str]
    file_rows: list[int]


def robust_cutoff(values: np.ndarray, rule: OutlierRule) -> Cutoff | None:
    """Median and normal-consistent MAD of `values` (NaN-free), floored at `rule.min_sigma`; None when
    there are none."""
    if values.size == 0:
        return None
    median = float(np.median(values))
    deviations = np.abs(values - median)
    mad = float(np.median(deviations))
    measured = _MAD_TO_SIGMA * mad if mad > 0 else _MEAN_AD_TO_SIGMA * float(deviations.mean())
    sigma = max(measured, rule.min_sigma)
    low = median - rule.k * sigma if rule.low_tail else None
    return Cutoff(median, sigma, median + rule.k * sigma, low, measured)


def reference_cutoff(
    median: float, measured_sigma: float, rule: OutlierRule, source: str, nights: list[str] | None = None
) -> Cutoff:
    """A reference's median and measured spread (a baseline's, the series') under tonight's rule: its k and
    floor, so a changed `--outlier-k` or `--outlier-min-sigma` applies to referenced scopes too."""
    sigma = max(measured_sigma, rule.min_sigma)
    low = median - rule.k * sigma if rule.low_tail else None
    return Cutoff(median, sigma, median + rule.k * sigma, low, measured_sigma, source, nights)


def scope_cutoffs(scanned: ScannedRows, rule: OutlierRule) -> dict[str, Cutoff]:
    """Each scope's cutoff from its own eligible rows, by name: `OVERALL` and every partition, whatever
    `rule.scope` (both rules list their worst rows, and the history keeps both scopes' figures)."""
    names = _names(scanned)
    found = {}
    for scope in SCOPES:
        groups = _groups(scanned.codes, len(scanned.partitions), scope)
        found.update({names[code]: cutoff for code, cutoff in _cutoffs(scanned.nll, groups, rule).items()})
    return found


def mostly_unknown(n_unknown: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    """Which rows are mostly the tokenizer's unknown token: over `MOSTLY_UNKNOWN` of their scored tokens, as
    summary.json's `mostly_unknown_rows` counts them (a row with no scored token is not)."""
    return n_unknown > MOSTLY_UNKNOWN * n_tokens


def write_outliers(
    scanned: ScannedRows,
    rule: OutlierRule,
    cutoffs: dict[str, Cutoff],
    listed: int,
    batch_rows: int,
    out_fs: pafs.FileSystem,
    path: str,
) -> tuple[dict, dict]:
    """Apply the rule, write the flagged rows to `path` (second pass); return audit.json's `outliers` and
    `unknown_tokens` sections.

    `outliers` lists the `listed` flagged rows of largest z, and under `worst` the `listed` highest rows by
    each scope's rule, flagged or not (each marked `flagged`), whatever `rule.scope`: `overall` (z against
    the whole corpus) and `partition` (z against the row's partition). Neither list is enough alone: junk
    that arrives as a file of its own is a partition whose median is the junk, which only the corpus-wide
    rule sees; a partition harder by design fills the corpus-wide list, under which a fragment within its
    partition only the per-partition rule sees. Rows mostly of unknown tokens are in neither: they are
    `unknown_tokens`' (the module's docstring says why).

    `cutoffs` gives each scope's cutoff by name (`OVERALL` or a partition): its own rows' (`scope_cutoffs`),
    or a reference's (`reference_cutoff`) so that junk that widens tonight's own spread cannot hide behind
    it. A scope it lacks has no eligible row.
    """
    unknown = scanned.unknown  # their NLL is NaN already: not judged, in no median or spread
    names = _names(scanned)
    judged = {scope: _judge(scanned, replace(rule, scope=scope), names, cutoffs) for scope in SCOPES}
    beyond = {scope: _beyond(z, rule) for scope, (_, z) in judged.items()}
    shown = {scope: _highest(z, rule, listed) for scope, (_, z) in judged.items()}
    cutoffs, z = judged[rule.scope]
    flagged, listing = np.flatnonzero(beyond[rule.scope]), np.concatenate(list(shown.values()))
    unknown_shown = unknown[:listed]
    read = np.union1d(np.union1d(flagged, listing), unknown_shown)  # sorted indices, as `_read_rows` needs
    entries, unknown_entries = _write_flagged(
        _read_rows(scanned, read, batch_rows), scanned, z, flagged, set(listing.tolist()), out_fs, path
    )
    worst = {
        scope: {
            "count": int(np.count_nonzero(beyond[scope])),
            "listed": [
                _as_judged(entries[i], judged[scope][1][i], bool(beyond[scope][i])) for i in shown[scope].tolist()
            ],
        }
        for scope in SCOPES
    }
    per_partition = np.bincount(scanned.codes[flagged], minlength=len(scanned.partitions))
    outliers = {
        "rule": {**asdict(rule), "statistic": NLL_PER_TOKEN, "sigma": _SIGMA},
        "cutoffs": {names[code]: _cutoff_dict(cutoff) for code, cutoff in cutoffs.items()},
        "eligible": int(np.count_nonzero(~np.isnan(scanned.nll))),
        "count": int(flagged.size),
        "by_partition": {names[code]: int(n) for code, n in enumerate(per_partition) if n},
        "listed": [row for row in worst[rule.scope]["listed"] if row["flagged"]],
        "worst": worst,
        "file": OUTLIERS_FILE,
    }
    unknown_by_partition = np.bincount(scanned.codes[unknown], minlength=len(scanned.partitions))
    unknown_tokens = {
        "rule": f"n_unknown / n_tokens > {MOSTLY_UNKNOWN:g}",
        "count": int(unknown.size),
        "by_partition": {names[code]: int(n) for code, n in enumerate(unknown_by_partition) if n},
        "listed": [unknown_entries[i] for i in unknown_shown.tolist()],
    }
    return outliers, unknown_tokens


def _names(scanned: ScannedRows) -> dict[int, str]:
    """The scope name of each `_groups` key: partition codes, and -1 for the corpus-wide cutoff."""
    return {**dict(enumerate(scanned.partitions)), -1: OVERALL}


def _judge(
    scanned: ScannedRows, rule: OutlierRule, names: dict[int, str], by_name: dict[str, Cutoff]
) -> tuple[dict[int, Cutoff], np.ndarray]:
    """The rule's cutoffs (by `_groups` key, taken from `by_name` through `names`) and every row's robust z
    under them (NaN where not eligible)."""
    nll = scanned.nll
    groups = _groups(scanned.codes, len(scanned.partitions), rule.scope)
    cutoffs = {code: by_name[names[code]] for code in groups if names[code] in by_name}
    z = np.full(nll.shape, np.nan)
    for code, cutoff in cutoffs.items():
        rows = groups[code]
        z[rows] = cutoff.z(nll[rows])
    return cutoffs, z


def _beyond(z: np.ndarray, rule: OutlierRule) -> np.ndarray:
    """Whether each row's z is beyond the rule's k (NaN, not eligible, is not)."""
    return (z > rule.k) | ((z < -rule.k) & rule.low_tail)  # NaN compares False


def _highest(z: np.ndarray, rule: OutlierRule, listed: int) -> np.ndarray:
    """The `listed` eligible rows of highest z (of largest |z| with `low_tail`), highest first, ties in row
    order: the flagged ones lead, and the list is never empty while there are rows to show.

    A partition at the `listed`-th value, not a sort of every row: this runs at the audit's peak of memory.
    """
    key = np.abs(z) if rule.low_tail else z.copy()  # (N,)
    key[np.isnan(key)] = -np.inf  # not eligible: never shown
    if listed < key.size:
        rows = np.flatnonzero(key >= np.partition(key, key.size - listed)[key.size - listed])
    else:
        rows = np.arange(key.size)
    rows = rows[key[rows] > -np.inf]
    return rows[np.argsort(-key[rows], kind="stable")[:listed]]


def _as_judged(entry: dict, z: float, flagged: bool) -> dict:
    """A listed row with its z (and so its tail) under one scope's rule, and whether that rule flags it."""
    return {**entry, ROBUST_Z: float(z), TAIL: "high" if z > 0 else "low", "flagged": flagged}


def _groups(codes: np.ndarray, partitions: int, scope: str) -> dict[int, np.ndarray]:
    """Row indices per cutoff key: the whole corpus (key -1), or each partition code's rows in file order.

    One stable sort of the codes, not one N-long mask per partition: a corpus partitioned by input file
    can hold 10^4 partitions, and N x partitions comparisons took hours at 10^6 rows.
    """
    if scope == "overall":
        return {-1: np.arange(codes.size)}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(partitions + 1))
    return {code: order[bounds[code] : bounds[code + 1]] for code in range(partitions)}


def _cutoffs(nll: np.ndarray, groups: dict[int, np.ndarray], rule: OutlierRule) -> dict[int, Cutoff]:
    """One cutoff per group (`_groups`) with eligible rows (a NaN NLL is not eligible)."""
    found = {}
    for code, rows in groups.items():
        values = nll[rows]
        found[code] = robust_cutoff(values[~np.isnan(values)], rule)
    return {code: cutoff for code, cutoff in found.items() if cutoff is not None}


def _cutoff_dict(cutoff: Cutoff) -> dict:
    """The cutoff in NLL-per-token units and as per-sentence PPPL (what the histogram shows)."""
    return {
        **asdict(cutoff),
        "high_pppl": _finite(float(np.exp(cutoff.high))),
        "low_pppl": float(np.exp(cutoff.low)) if cutoff.low is not None else None,
    }


def _write_flagged(
    rows: Iterator[tuple[pa.RecordBatch, np.ndarray]],
    scanned: ScannedRows,
    z: np.ndarray,
    flagged: np.ndarray,
    listed: set[int],
    out_fs: pafs.FileSystem,
    path: str,
) -> tuple[dict[int, dict], dict[int, dict]]:
    """Write the `flagged` rows (sorted indices) of those read to outliers.parquet; return the `listed` ones
    as audit.json entries by row index, and the rows read that are mostly unknown tokens likewise."""
    entries: dict[int, dict] = {}
    unknown: dict[int, dict] = {}
    partitions = pa.array(scanned.partitions, pa.string())
    with pq.ParquetWriter(path, OUTLIER_SCHEMA, filesystem=out_fs) as writer:
        for batch, index in rows:
            names = partitions.take(scanned.codes[index])
            table = _outlier_table(batch, names, scanned.nll[index], z[index])
            writer.write_table(table.filter(pa.array(np.isin(index, flagged, assume_unique=True))))
            keep = [i for i, row in enumerate(index.tolist()) if row in listed]
            for row, record in zip(index[keep].tolist(), table.take(pa.array(keep, pa.int64())).to_pylist()):
                entries[row] = _listing(record)
            odd = pa.array(np.flatnonzero(np.isin(index, scanned.unknown)), pa.int64())
            for row, record, name in zip(index[odd].tolist(), batch.take(odd).to_pylist(), names.take(odd).to_pylist()):
                unknown[row] = _unknown_listing(record, name)
    return entries, unknown


def _read_rows(scanned: ScannedRows, rows: np.ndarray, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The given rows (sorted global indices) with the columns outliers.parquet needs, and their indices.

    Only the files and row groups holding one of them are opened and read: a clean corpus costs nothing.
    """
    start = 0
    for path, n in zip(scanned.files, scanned.file_rows):
        local = rows[np.searchsorted(rows, start) : np.searchsorted(rows, start + n)] - start  # rows are sorted
        if local.size:
            with pq.ParquetFile(path, filesystem=scanned.fs) as pf:
                if pf.metadata.num_rows != n:
                    raise UserError(f"{path} changed during the audit ({n} rows, then {pf.metadata.num_rows})")
                present = [c for c in _COLUMNS if c in pf.schema_arrow.names]
                for batch, taken in _take(pf, local, present, batch_rows):
                    yield batch, taken + start
        start += n


def _take(
    pf: pq.ParquetFile, rows: np.ndarray, columns: list[str], batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Rows (sorted indices within the file) of one open file, read only from the row groups holding them."""
    group_start = 0
    for group in range(pf.num_row_groups):
        group_rows = pf.metadata.row_group(group).num_rows
        hits = rows[(rows >= group_start) & (rows < group_start + group_rows)]
        if hits.size:
            batches = pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns)
            yield from _take_from(batches, hits, group_start)
        group_start += group_rows


def _take_from(
    batches: Iterator[pa.RecordBatch], rows: np.ndarray, start: int
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The given rows (sorted; the first batch starts at row `start`) out of consecutive batches."""
    for batch in batches:
        inside = rows[(rows >= start) & (rows < start + batch.num_rows)]
        if inside.size:
            yield batch.take(pa.array(inside - start)), inside
        start += batch.num_rows


def _outlier_table(batch: pa.RecordBatch, partitions: pa.Array, nll: np.ndarray, z: np.ndarray) -> pa.Table:
    """Flagged rows in OUTLIER_SCHEMA; token columns are null when the rows have none."""

    def column(name: str) -> pa.Array:
        return batch[name] if name in batch.schema.names else pa.nulls(batch.num_rows)

    with np.errstate(over="ignore"):
        pppl = np.exp(nll)
    arrays = [
        batch[S.ID],
        partitions,
        batch[S.TEXT],
        batch[S.PLL],
        batch[S.N_TOKENS],
        batch[S.N_WORDS],
        pa.array(nll),
        pa.array(pppl),
        pa.array(z),
        pa.array(np.where(z > 0, "high", "low")),
        column(S.TOKENS),
        column(S.TOKEN_LOGPROBS),
    ]
    return pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, OUTLIER_SCHEMA)], schema=OUTLIER_SCHEMA)


def _listing(record: dict) -> dict:
    """A flagged row as audit.json lists it: scores, the text (cut), and its hardest token."""
    text, tokens, logprobs = record[S.TEXT] or "", record[S.TOKENS], record[S.TOKEN_LOGPROBS]
    worst = int(np.argmin(logprobs)) if logprobs else None
    return {
        S.ID: record[S.ID],
        S.PARTITION: record[S.PARTITION],
        S.TEXT: text[:_LISTED_TEXT_CHARS],
        "text_truncated": len(text) > _LISTED_TEXT_CHARS,
        S.N_TOKENS: record[S.N_TOKENS],
        NLL_PER_TOKEN: record[NLL_PER_TOKEN],
        S.PPPL_TOKEN: _finite(record[S.PPPL_TOKEN]),
        ROBUST_Z: record[ROBUST_Z],
        TAIL: record[TAIL],
        "worst_position": None if worst is None else worst + 1,
        "worst_token": tokens[worst] if worst is not None and tokens and worst < len(tokens) else None,
        "worst_token_nll": None if worst is None else -logprobs[worst],
    }


def _unknown_listing(record: dict, partition: str) -> dict:
    """A row mostly of unknown tokens as audit.json lists it: where it is, its text (cut), the share."""
    text = record[S.TEXT] or ""
    return {
        S.ID: record[S.ID],
        S.PARTITION: partition,
        S.TEXT: text[:_LISTED_TEXT_CHARS],
        "text_truncated": len(text) > _LISTED_TEXT_CHARS,
        S.N_TOKENS: record[S.N_TOKENS],
        UNKNOWN_SHARE: record[S.N_UNKNOWN] / record[S.N_TOKENS],
        NLL_PER_TOKEN: -record[S.PLL] / record[S.N_TOKENS],
    }


def _finite(value: float | None) -> float | None:
    """JSON has no infinity: a PPPL too large for a float is written as null."""
    return value if value is not None and np.isfinite(value) else None
