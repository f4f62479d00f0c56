"""The nightly PPPL audit: corpus figures, outliers and a baseline comparison over scored Parquet rows.

It runs after scoring, on the driver, over `DIR/rows/*.parquet` with a string column naming each row's
partition (source, domain, input file; `schema.PARTITION` unless configured). Two streaming passes keep
memory flat however large the corpus (only one NLL and one partition code per sentence stay in memory):

1. every file, batch by batch: summable figures (`CorpusStats`, a log-binned histogram of per-sentence
   PPPL, positionwise cross-entropy as in Salazar et al. 2020, Figure 4), per partition where cheap;
2. only the files and row groups holding flagged sentences: their text and tokens, written to
   `outliers.parquet` (the rule and that pass are in `outliers.py`), and the few rows the report lists
   (the highest by each rule, and rows made mostly of unknown tokens, `unknown_tokens`).

A previous `audit.json` is the baseline (`baseline.py` compares and gives the exit code; its outlier cutoffs,
when the same scorer wrote it, are tonight's); with a history, the reference nights' cutoffs are tonight's
where the baseline gives none (`nightly.series_cutoffs`). This module owns the first pass and the assembly of
audit.json; `report.py` renders it as report.html.
"""

from __future__ import annotations

import datetime
import json
import logging
import posixpath
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ...errors import UserError
from ...io import schema as S
from ...io.claim import Claim, claim
from ...io.output import REPORT_HTML, ROWS_DIR, SUMMARY_FILE, OutputDir
from ...io.storage import filesystem, join
from ...pipeline.stats import STAT_COLUMNS, CorpusStats
from ...versions import package_version
from .baseline import AUDIT_FILE, SCHEMA_VERSION, compare
from .baseline_io import load_baseline, load_row_stats, row_stats_table
from .nightly import OpenNight, SeriesInputs, audit_night, combined_exit, open_night, series_cutoffs
from .outliers import (
    BASELINE,
    OUTLIERS_FILE,
    Cutoff,
    OutlierRule,
    ScannedRows,
    mostly_unknown,
    reference_cutoff,
    scope_cutoffs,
    write_outliers,
)
from .records import (
    AuditRecord,
    Bins,
    Histogram,
    LengthCurve,
    Outliers,
    PositionMeans,
    Positionwise,
    ScopeFigures,
    UnknownTokens,
)
from .row_stats import ROW_STATS_FILE, ROW_STATS_SCHEMA
from .verdicts import EXIT_OK, OVERALL, Comparison, Thresholds

__all__ = ["AuditConfig", "AuditResult", "LogBins", "PositionCurves", "run_audit", "NO_PARTITION"]

logger = logging.getLogger(__name__)

AUDIT_OUTPUTS = (AUDIT_FILE, ROW_STATS_FILE, OUTLIERS_FILE, REPORT_HTML)  # what an audit writes beside the rows
NO_PARTITION = "(none)"  # the partition of rows whose partition value is null

_REQUIRED = [S.ID, S.TEXT, *STAT_COLUMNS, S.MODEL, S.VARIANT]


@dataclass(frozen=True)
class LogBins:
    """Fixed log-spaced bins of per-sentence PPPL: [edge_i, edge_i+1), plus underflow and overflow.

    Fixed (not data-driven) edges make histograms of different nights and partitions add up and compare.
    """

    low: float = 1.0
    high: float = 1e5
    bins: int = 50

    def __post_init__(self) -> None:
        if not (0 < self.low < self.high) or self.bins < 1:
            raise UserError(f"histogram needs 0 < low < high and bins >= 1, got {self}")

    def log_edges(self) -> np.ndarray:
        return np.linspace(np.log(self.low), np.log(self.high), self.bins + 1)  # (bins + 1,)


@dataclass(frozen=True)
class AuditConfig:
    """Everything the audit's figures depend on; recorded in audit.json.

    `max_position` bounds the absolute-position curve, `max_length` the sentence lengths that get a
    Figure-4 curve of their own; `listed` is how many flagged sentences audit.json and the report show in
    each list (the rule's, and the worst rows overall and per partition).
    """

    partition_column: str = S.PARTITION
    outliers: OutlierRule = OutlierRule()
    thresholds: Thresholds = Thresholds()
    histogram: LogBins = LogBins()
    max_position: int = 512
    max_length: int = 512
    listed: int = 50
    batch_rows: int = 4096

    def __post_init__(self) -> None:
        if min(self.max_position, self.max_length, self.batch_rows) < 1 or self.listed < 0:
            raise UserError(f"max_position, max_length and batch_rows must be positive, listed >= 0: {self}")


@dataclass(frozen=True, eq=False)
class PositionCurves:
    """Summable positionwise cross-entropy -log p(w_t | W without w_t) (natural log).

    Position t is the 1-based index of a scored token within its sentence (special tokens are never
    scored, so t = 1 is the first real token), in the order of the `token_logprobs` column. Two views:
    by absolute position over all sentences long enough to have one (`*_by_position`, up to
    `max_position`), and, as in Salazar et al.'s Figure 4, per exact sentence length L (`*_by_length`,
    row L holds positions 1..L, for L up to `max_length`): only there is a flat curve expected.
    """

    sum_by_position: np.ndarray  # (max_position + 1,) float64, index t; index 0 unused
    tokens_by_position: np.ndarray  # (max_position + 1,) int64
    sum_by_length: np.ndarray  # (max_length + 1, max_length + 1) float64, [L, t]
    sentences_by_length: np.ndarray  # (max_length + 1,) int64

    def __add__(self, other: "PositionCurves") -> "PositionCurves":
        return PositionCurves(*(a + b for a, b in zip(self.arrays(), other.arrays())))

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.sum_by_position, self.tokens_by_position, self.sum_by_length, self.sentences_by_length)

    @classmethod
    def of_lists(cls, logprobs: pa.Array, max_position: int, max_length: int) -> "PositionCurves":
        """The curves of one batch of per-token log-probability lists (null lists count as empty)."""
        lengths = pc.fill_null(pc.list_value_length(logprobs), 0).to_numpy(zero_copy_only=False)  # (R,)
        nll = -pc.list_flatten(logprobs).to_numpy(zero_copy_only=False)  # (T,) T = sum(lengths)
        length = np.repeat(lengths, lengths)  # (T,) the sentence length of each token
        starts = np.cumsum(lengths) - lengths  # (R,)
        position = np.arange(nll.size) - np.repeat(starts, lengths) + 1  # (T,) 1-based
        near = position <= max_position
        fits = length <= max_length
        side = max_length + 1
        by_length = np.bincount(length[fits] * side + position[fits], weights=nll[fits], minlength=side * side)
        return cls(
            np.bincount(position[near], weights=nll[near], minlength=max_position + 1),
            np.bincount(position[near], minlength=max_position + 1),
            by_length.reshape(side, side),
            np.bincount(lengths[lengths <= max_length], minlength=side),
        )

    def record(self) -> Positionwise:
        """Sums and counts (summable across audits) and the absolute-position means (for reading)."""
        last = int(np.flatnonzero(self.tokens_by_position)[-1]) if self.tokens_by_position.any() else 0
        tokens = self.tokens_by_position[1 : last + 1]
        sums = self.sum_by_position[1 : last + 1]
        return Positionwise(
            quantity="-log p(w_t | W without w_t), natural log; t = 1-based position among scored tokens",
            by_position=PositionMeans(sums.tolist(), tokens.tolist(), (sums / np.maximum(tokens, 1)).tolist()),
            by_length={
                str(length): LengthCurve(int(n), self.sum_by_length[length, 1 : length + 1].tolist())
                for length, n in enumerate(self.sentences_by_length)
                if n > 0 and length > 0
            },
            max_position=self.sum_by_position.size - 1,
            max_length=self.sentences_by_length.size - 1,
        )


@dataclass
class _Scan:
    """What the first pass gathers: summable figures per partition, one NLL and code per row."""

    stats: dict[str, CorpusStats] = field(default_factory=dict)
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    curves: PositionCurves | None = None
    signatures: set[tuple[str, str]] = field(default_factory=set)
    codes_of: dict[str, int] = field(default_factory=dict)  # partition name -> code
    nll: list[np.ndarray] = field(default_factory=list)  # per batch, NaN where not eligible as outlier
    unknown: list[np.ndarray] = field(default_factory=list)  # per batch, the indices of rows mostly unknown tokens
    seen: int = 0  # rows scanned so far: the next batch's first index
    codes: list[np.ndarray] = field(default_factory=list)
    file_rows: list[int] = field(default_factory=list)
    windowed: int | None = None  # ok rows scored in windows; None while no file has the `windowed` column

    def rows(self, fs: pafs.FileSystem, files: list[str]) -> ScannedRows:
        """What the outlier rule and the second pass need of the scanned `files`."""
        nll = np.concatenate(self.nll) if self.nll else np.empty(0)
        unknown = np.concatenate(self.unknown) if self.unknown else np.empty(0, dtype=np.int64)
        codes = np.concatenate(self.codes) if self.codes else np.empty(0, dtype=np.int32)
        partitions = list(self.codes_of)  # in code order
        return ScannedRows(nll, unknown, codes, partitions, fs, files, self.file_rows)


@dataclass(frozen=True)
class AuditResult:
    """What `run_audit` wrote: `record` is audit.json, `audit` its content as written."""

    record: AuditRecord
    output_dir: str

    @property
    def audit(self) -> dict:
        return self.record.to_json()

    @property
    def comparison(self) -> Comparison | None:
        return self.record.baseline

    @property
    def exit_code(self) -> int:
        series = self.record.series
        return combined_exit(self.comparison.exit_code if self.comparison else EXIT_OK, series)

    @property
    def audit_path(self) -> str:
        return join(self.output_dir, AUDIT_FILE)

    @property
    def outliers_path(self) -> str:
        return join(self.output_dir, OUTLIERS_FILE)

    @property
    def report_path(self) -> str:
        return join(self.output_dir, REPORT_HTML)


def run_audit(
    rows_dir: str,
    output_dir: str,
    baseline: str | None = None,
    config: AuditConfig = AuditConfig(),
    folder: Claim | None = None,
    series: SeriesInputs | None = None,
) -> AuditResult:
    """Audit the scored rows in `rows_dir` (a scoring output folder or its rows/ folder).

    Writes audit.json, row_stats.parquet, outliers.parquet and report.html into `output_dir` (local path or
    URI), holding it (`folder`, when the caller holds it already); `baseline` is a previous audit.json, or
    the folder holding it; `series`, tonight's place in a history (judged against it, then appended).
    """
    from .report import render_report

    base, base_uri = load_baseline(baseline) if baseline else (None, None)
    fs, files, root = _scored_files(rows_dir)
    if folder is None:
        with claim(output_dir, [rows_dir, *([baseline] if baseline else [])]) as held:
            return run_audit(rows_dir, output_dir, baseline, config, held, series)
    logger.info("auditing %d Parquet files under %s", len(files), root)
    out = folder.out
    with pq.ParquetWriter(out.path(ROW_STATS_FILE), ROW_STATS_SCHEMA, filesystem=out.fs) as row_stats:
        scan = _scan(fs, files, config, row_stats)
    folder.record(ROW_STATS_FILE)
    summary = _summary(fs, root)
    night = open_night(series, summary.get("signature")) if series is not None else None
    scanned = scan.rows(fs, files)
    own = scope_cutoffs(scanned, config.outliers)
    reference = _reference_cutoffs(base, scan, night, config.outliers)
    outliers, unknown = write_outliers(
        scanned,
        config.outliers,
        {name: reference.get(name, cutoff) for name, cutoff in own.items()},
        config.listed,
        config.batch_rows,
        out.fs,
        out.path(OUTLIERS_FILE),
    )
    folder.record(OUTLIERS_FILE)
    audit = _audit_record(rows_dir, scan, outliers, own, config, summary.get("signature"), student_estimate(summary))
    audit = replace(audit, unknown_tokens=UnknownTokens.from_json(unknown))
    current_rows = pq.read_table(out.path(ROW_STATS_FILE), filesystem=out.fs) if base or series else None
    if base is not None:
        comparison = compare(audit, base, base_uri, config.thresholds, current_rows, load_row_stats(base_uri, base))
        audit = replace(audit, baseline=comparison)
    if night is not None:
        bins = {OVERALL: audit.histogram.overall, **audit.histogram.partitions}
        counts = {name: b.all_counts() for name, b in bins.items()}
        scopes = {OVERALL: audit.overall, **audit.partitions}
        judged = audit_night(night, scopes, counts, current_rows, config.thresholds)
        audit = replace(audit, series=judged)
    folder.write_json(AUDIT_FILE, audit.to_json())
    folder.write_text(REPORT_HTML, render_report(audit, base))
    result = AuditResult(audit, output_dir)
    logger.info(
        "audit: %d rows, pppl_token %s, %d outliers, verdict %s (exit %d)",
        audit.overall.rows,
        audit.overall.pppl_token,
        audit.outliers.count,
        audit.series.verdict if audit.series else audit.baseline.verdict if audit.baseline else "no baseline",
        result.exit_code,
    )
    return result


def _reference_cutoffs(
    base: AuditRecord | None, scan: _Scan, night: OpenNight | None, rule: OutlierRule
) -> dict[str, Cutoff]:
    """The outlier cutoffs that are not tonight's own, by scope name: the baseline's where it has one and the
    same model and variant scored both (another scorer's NLLs are on another scale), else the series' reference
    nights' (`series_cutoffs`: none across a scorer change, which starts a new segment)."""
    found = series_cutoffs(night.segment, rule) if night is not None else {}
    if base is None:
        return found
    scorers = base.signature if isinstance(base.signature, list) else [base.signature]
    if sorted((s[S.MODEL], s[S.VARIANT]) for s in scorers) != sorted(scan.signatures):
        logger.info("the baseline was scored by another model or variant: its outlier cutoffs are not used")
        return found
    for name, c in base.outliers.cutoffs.items():
        measured = c.sigma if c.measured_sigma is None else c.measured_sigma  # files written before it: the sigma
        found[name] = reference_cutoff(c.median, measured, rule, BASELINE)
    return found


def _scored_files(rows_dir: str) -> tuple[pafs.FileSystem, list[str], str]:
    """The Parquet files of the scored rows, in a stable order (both passes rely on it), and the folder
    holding them: of a folder with `rows/`, its rows' files (`OutputDir.row_parts`: in a run folder, its marked
    shards); of any other folder, its visible Parquet files."""
    fs, root = filesystem(rows_dir)
    if fs is None:
        raise UserError(f"cannot list {rows_dir!r}: use a local path or an s3://, gs:// or file:// URI")
    run = OutputDir(rows_dir.rstrip("/").removesuffix("/" + ROWS_DIR))
    if run.exists(run.path(ROWS_DIR)):
        root, files = run.path(ROWS_DIR), run.row_parts()
    else:
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        files = sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File
            and i.path.endswith(".parquet")
            and not posixpath.basename(i.path).startswith((".", "_"))
        )
    if not files:
        raise UserError(f"no scored rows in {rows_dir!r}: expected {ROWS_DIR}/*.parquet from `dscore score`")
    return fs, files, root.removesuffix("/" + ROWS_DIR)


def _columns(pf: pq.ParquetFile, path: str, config: AuditConfig) -> list[str]:
    """The first pass's columns of one file, after checking that it has the required ones."""
    names = pf.schema_arrow.names
    missing = [c for c in [*_REQUIRED, config.partition_column] if c not in names]
    if missing:
        raise UserError(
            f"{path} lacks the column(s) {missing} (it has {names}); the audit reads `dscore score` rows "
            f"with a {config.partition_column!r} column (set AuditConfig.partition_column for another name)"
        )
    optional = [c for c in (S.TOKEN_LOGPROBS, S.WINDOWED, S.N_UNKNOWN) if c in names]
    return [S.ID, config.partition_column, *STAT_COLUMNS, S.MODEL, S.VARIANT, *optional]


def _scan(fs: pafs.FileSystem, files: list[str], config: AuditConfig, row_stats: pq.ParquetWriter) -> _Scan:
    """First pass: every row of every file, in batches; each row's figures go to `row_stats`."""
    scan = _Scan()
    without_tokens = 0
    for path in files:
        with pq.ParquetFile(path, filesystem=fs) as pf:
            columns = _columns(pf, path, config)
            without_tokens += S.TOKEN_LOGPROBS not in columns
            for batch in pf.iter_batches(batch_size=config.batch_rows, columns=columns):
                row_stats.write_table(_add_batch(scan, batch, config))
            scan.file_rows.append(pf.metadata.num_rows)
    if without_tokens:
        logger.warning(
            "%d of %d files have no %s column (scored without --per-token): their rows are left "
            "out of the positionwise curves",
            without_tokens,
            len(files),
            S.TOKEN_LOGPROBS,
        )
    return scan


def _add_batch(scan: _Scan, batch: pa.RecordBatch, config: AuditConfig) -> pa.Table:
    """Add a batch to the scan's figures; returns its per-row figures (for the baseline intervals)."""
    names = pc.fill_null(batch[config.partition_column].cast(pa.string()), NO_PARTITION).dictionary_encode()
    local = names.indices.to_numpy(zero_copy_only=False)  # (R,) code within this batch
    nll = _nll_per_token(batch)  # (R,) NaN for rows without a score
    scored = ~np.isnan(nll)
    # searchsorted: 0 = underflow, i = bin i (1-based), bins + 1 = overflow; NaN lands past the end, masked.
    bins = np.searchsorted(config.histogram.log_edges(), nll, side="right")
    stat_columns = batch.select(STAT_COLUMNS)
    to_code = np.empty(len(names.dictionary), dtype=np.int32)
    for i, name in enumerate(names.dictionary.to_pylist()):
        rows = local == i
        stats = CorpusStats.of_table(stat_columns.filter(pa.array(rows)))
        scan.stats[name] = scan.stats.get(name, CorpusStats()) + stats
        counts = np.bincount(bins[rows & scored], minlength=config.histogram.bins + 2)
        scan.histograms[name] = scan.histograms.get(name, 0) + counts
        to_code[i] = scan.codes_of.setdefault(name, len(scan.codes_of))
    scan.codes.append(to_code[local])
    n_tokens = batch[S.N_TOKENS].to_numpy(zero_copy_only=False)
    unknown = _mostly_unknown(batch) & scored
    scan.nll.append(np.where((n_tokens >= config.outliers.min_tokens) & ~unknown, nll, np.nan))
    scan.unknown.append(np.flatnonzero(unknown) + scan.seen)
    scan.seen += batch.num_rows
    scorers = pa.Table.from_batches([batch.select([S.MODEL, S.VARIANT])]).group_by([S.MODEL, S.VARIANT]).aggregate([])
    scan.signatures.update(zip(scorers[S.MODEL].to_pylist(), scorers[S.VARIANT].to_pylist()))
    if S.WINDOWED in batch.schema.names:
        ok = pc.equal(batch[S.STATUS], S.STATUS_OK)
        scan.windowed = (scan.windowed or 0) + (pc.sum(pc.and_(ok, batch[S.WINDOWED]).cast(pa.int64())).as_py() or 0)
    if S.TOKEN_LOGPROBS in batch.schema.names:
        lists = batch[S.TOKEN_LOGPROBS].filter(pa.array(scored))
        curves = PositionCurves.of_lists(lists, config.max_position, config.max_length)
        scan.curves = curves if scan.curves is None else scan.curves + curves
    return row_stats_table(batch, names.dictionary.take(names.indices))


def _nll_per_token(batch: pa.RecordBatch) -> np.ndarray:
    """-PLL / n_tokens of ok rows with scored tokens; NaN elsewhere."""
    ok = pc.equal(batch[S.STATUS], S.STATUS_OK).to_numpy(zero_copy_only=False)
    pll = batch[S.PLL].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN
    n = pc.fill_null(batch[S.N_TOKENS], 0).to_numpy(zero_copy_only=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok & (n > 0), -pll / n, np.nan)


def _mostly_unknown(batch: pa.RecordBatch) -> np.ndarray:
    """Which rows are mostly unknown tokens (`outliers.mostly_unknown`); none in rows scored before `n_unknown`
    existed. Their PLL measures the tokenizer, not the text: the outlier rule leaves them out."""
    if S.N_UNKNOWN not in batch.schema.names:
        return np.zeros(batch.num_rows, dtype=bool)
    unknown = pc.fill_null(batch[S.N_UNKNOWN], 0).to_numpy(zero_copy_only=False)
    return mostly_unknown(unknown, pc.fill_null(batch[S.N_TOKENS], 0).to_numpy(zero_copy_only=False))


def _audit_record(
    rows_dir: str,
    scan: _Scan,
    outliers: dict,
    own: dict[str, Cutoff],
    config: AuditConfig,
    scorer: dict | list | None,
    estimate: dict | None = None,
) -> AuditRecord:
    """audit.json of the first pass's figures and the outliers (`write_outliers`' object; `own`, each scope's
    cutoff from its own rows, `scope_cutoffs`')."""
    overall = sum(scan.stats.values(), CorpusStats())
    signatures = [{S.MODEL: m, S.VARIANT: v} for m, v in sorted(scan.signatures)]
    if len(signatures) > 1:
        logger.warning("the rows were scored by %d model/variant pairs: %s", len(signatures), signatures)
    flagged = Outliers.from_json(outliers)
    return AuditRecord(
        version=SCHEMA_VERSION,
        row_stats=ROW_STATS_FILE,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        package_version=package_version("distributed-scoring"),
        rows_dir=rows_dir,
        signature=signatures[0] if len(signatures) == 1 else signatures,
        scorer_signature=scorer,
        config=asdict(config),
        overall=_figures(overall, flagged.count, own.get(OVERALL)),
        partitions={
            name: _figures(scan.stats[name], flagged.by_partition.get(name, 0), own.get(name))
            for name in sorted(scan.stats)
        },
        histogram=_histogram(scan, config.histogram),
        positionwise=scan.curves.record() if scan.curves is not None else None,
        outliers=flagged,
        estimate=estimate,
        windowed_rows=scan.windowed,
    )


def _figures(stats: CorpusStats, outliers: int, own: Cutoff | None) -> ScopeFigures:
    error_rate = stats.errors / stats.rows if stats.rows else 0.0
    return ScopeFigures(
        **asdict(stats),
        pppl_token=stats.pppl_token,
        pppl_word=stats.pppl_word,
        error_rate=error_rate,
        outliers=outliers,
        outlier_median=own.median if own else None,
        outlier_sigma=own.measured_sigma if own else None,
    )


def _histogram(scan: _Scan, bins: LogBins) -> Histogram:
    overall = sum(scan.histograms.values(), np.zeros(bins.bins + 2, np.int64))
    return Histogram(
        quantity="per-sentence pppl_token = exp(-pll / n_tokens), ok rows with n_tokens > 0",
        edges=np.exp(bins.log_edges()).tolist(),
        overall=_bins(overall),
        partitions={name: _bins(h) for name, h in sorted(scan.histograms.items())},
    )


def _bins(counts: np.ndarray) -> Bins:
    return Bins(underflow=int(counts[0]), counts=counts[1:-1].tolist(), overflow=int(counts[-1]))


def _summary(fs: pafs.FileSystem, root: str) -> dict:
    """The scoring run's summary.json, when the folder has one (its signature, and what scored it)."""
    path = posixpath.join(root, SUMMARY_FILE)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return {}
    with fs.open_input_stream(path) as stream:
        return json.loads(stream.read())


def student_estimate(summary: dict) -> dict | None:
    """What audit.json says of rows a maskless student scored (`dscore audit --maskless`): that their PPPLs
    are its estimate of the teacher's, with its held-out error against the teacher; None for other rows."""
    if summary.get("method") != "maskless":
        return None
    return {
        "scorer": "maskless student",
        "student": summary.get("model"),
        "target": summary.get("target"),
        "teacher": summary.get("teacher"),
        "heldout": summary.get("heldout"),
        "out_of_range": summary.get("out_of_range"),
        "note": "a fast screening audit: every PLL here is a maskless student's estimate of its teacher's PLL, not "
        "the PLL; heldout gives its agreement with the teacher on rows it was not trained on (rmse in "
        "nats per sentence). Confirm a finding with `dscore audit --model` before acting on it",
    }
