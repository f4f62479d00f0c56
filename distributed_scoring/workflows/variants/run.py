"""Variant effects of deep mutational scans (`dscore variants`), by the four strategies of Meier et al. (2021):

    wt-marginal       sum over sites of log p(mt | W) - log p(wt | W), W the wild type   1 pass per wild type
    masked-marginal   the same with each site masked in W                              <= L passes per wild type
    mutant-marginal   the same read from the mutant sequence M                         1 pass per variant
    pll               PLL(M) - PLL(W), each distinct sequence once                     L passes per sequence

The marginals' tables (`workloads.variants`) are computed once per wild type (or per mutant) by a sharded
run, in this process or on Ray, and joined to the variants by key (assay, mutant) here; `pll` scores the
distinct sequences with `dscore score`'s run and joins by sequence. Layout of the output folder DIR (held,
locked, from the first byte to the last):
    DIR/_run.json                  what the run is (tables, target, strategy, model) and what it wrote
    DIR/inputs/sequences.parquet   what the model reads: id, text and, for the marginals, the sites to tabulate
    DIR/sites/ or DIR/pll/         the scoring run over them (rows/, summary, resumable)
    DIR/variants.parquet           every input row, its columns kept, with DMS_id, score, n_mutations, status, error
    DIR/summary.json, DIR/report.md, DIR/scatter.png
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import MISSING, dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ...errors import UserError
from ...io import schema as S
from ...io.claim import Claim, claim
from ...io.dms import (
    DMS_ID,
    DMS_SCORE,
    DMS_SCORE_BIN,
    MUTANT,
    MUTATED_SEQUENCE,
    Assay,
    DMSError,
    file_name,
    numbers_of,
    read_reference,
    read_table,
    refuse_repeats,
    strings_of,
    table_batches,
    table_columns,
)
from ...io.output import REPORT_MD, SUMMARY_FILE, OutputDir, recorded_values
from ...options import carried, check, check_bounds, option
from ...pipeline.runner import run
from ...workloads.variants import (
    MARGINALS,
    PASSES,
    SITES,
    STRATEGIES,
    ResidueVocabulary,
    SiteOptions,
    Variant,
    found_plls,
    found_tables,
    read_variant,
    residue_vocabulary,
    sequences,
    sequences_schema,
    site_workload,
    variant_scores,
)
from ..score import score
from .proteingym import METRICS, BenchmarkAssay, Measurements, assay_figures, benchmark, depth_group
from .report import SCATTER, write_report
from .stats import Estimate, auc, estimate, spearman

logger = logging.getLogger(__name__)

VARIANTS_RUN = "variants"  # the workload of DIR/_run.json
SEQUENCES = "inputs/sequences.parquet"
SEQUENCES_DIGEST = "sequences_to_score"  # _run.json: what the tables make the model read
SITES_RUN, PLL_RUN = "sites", "pll"
OUTPUT_FILES = ("variants.parquet", SUMMARY_FILE, REPORT_MD, SCATTER)
SCORE, N_MUTATIONS = "score", "n_mutations"
ADDED = (DMS_ID, SCORE, N_MUTATIONS, S.STATUS, S.ERROR)  # the columns each input row gains (DMS_id if it lacks one)


@dataclass(frozen=True)
class VariantsInputs:
    """The DMS table(s), the wild type (one `target_seq`, or a ProteinGym `reference` file naming many assays,
    their tables under `table`), the strategy, the numbering of `mutant`'s positions (`offset`: the number of
    the target's first residue) and the output folder."""

    table: str
    output: str
    strategy: str = option(
        MISSING,
        "wt-marginal (1 pass per wild type, per window of a long one), masked-marginal (one masked pass per "
        "mutated position of the wild type), mutant-marginal (1 pass per variant) or pll (PLL(mutant) - PLL(wild "
        "type), L passes per sequence)",
        choices=STRATEGIES,
    )
    target_seq: str | None = option(None, "the wild type, one letter per residue", metavar="SEQ")
    reference: str | None = option(
        None,
        "ProteinGym's reference file (DMS_id, DMS_filename, target_seq, ...): every assay it lists is scored",
        metavar="REFERENCE.csv",
    )
    offset: int = option(
        1, "the number of the target's first residue in `mutant` (default 1: ProteinGym's 1-based positions)"
    )
    windows: str = carried(SiteOptions, "windows")
    shard_rows: int = 1000
    fit_actors: bool = False

    def __post_init__(self) -> None:
        check(self)
        if (self.target_seq is None) == (self.reference is None):
            raise UserError("pass either --target-seq SEQ (one assay) or --reference REFERENCE.csv (ProteinGym's)")
        if self.target_seq is not None and not self.target_seq.strip().isalpha():
            raise UserError("--target-seq must be the wild type's residues, one letter each (e.g. MKTAYIAK...)")
        check_bounds("--shard-rows", self.shard_rows, 1)
        if self.windows == "proteingym" and self.strategy != "masked-marginal":
            raise UserError(
                f"--windows proteingym applies to --strategy masked-marginal only, not {self.strategy}: ProteinGym's "
                "ESM script windows its masked marginals alone (it reads an unmasked long wild type whole)"
            )


@dataclass(frozen=True)
class AssayRows:
    """An assay, its table as read and its rows' variants, in the table's order."""

    assay: Assay
    table: pa.Table
    variants: list[Variant]


def score_variants(
    inputs: VariantsInputs,
    model: ModelSpec,
    batch_tokens: int | None = None,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    long_texts: str = "window",
) -> dict:
    """Read and check every table, refuse a model without one token per residue (the marginals), score, join
    and write DIR/variants.parquet, the summary and the report; returns the summary."""
    from ...engine.model_files import load_tokenizer

    began = time.monotonic()  # the summary's seconds: from here to the statistics (the outputs' writing aside)
    assays = _assays(inputs)
    tokenizer, _ = load_tokenizer(model)  # a model that cannot be loaded stops the run before any file is written
    targets = [a.target_seq for a in assays if a.target_seq]  # an assay without one has only error rows
    vocabulary = residue_vocabulary(tokenizer, model.name, inputs.strategy, targets[0]) if targets else None
    read = [_read_assay(a, inputs, vocabulary) for a in assays]
    texts = pa.table(
        sequences([(a.assay.id, a.assay.target_seq, a.variants) for a in read], inputs.strategy),
        schema=sequences_schema(inputs.strategy),
    )
    run = {
        "workload": VARIANTS_RUN,
        **{k: v for k, v in recorded_values(inputs).items() if k not in ("output", "fit_actors")},  # Ray's sizing aside
        "model": model.name,
        "long_texts": long_texts,
        SEQUENCES_DIGEST: _digest(texts),  # an edited table that changes what is scored is another run
    }
    sources = [inputs.table, *([inputs.reference] if inputs.reference else [])]
    sub = SITES_RUN if inputs.strategy in MARGINALS else PLL_RUN
    with claim(inputs.output, sources, [model.name]) as folder:
        runs = [sub] if texts.num_rows else []  # no variant to score: no scoring run, every row an error row
        folder.begin(run, folder.admit(run, overwrite), [SEQUENCES, *runs, *OUTPUT_FILES])
        where = folder.write_table(SEQUENCES, texts)
        found: dict[str, Any] = {}
        passes = 0
        if runs:
            corpus = InputSpec(
                (where,),
                id_column=S.ID,
                shard_rows=inputs.shard_rows,
                extra_columns=(SITES,) if sub == SITES_RUN else (),
                fit_actors=inputs.fit_actors,
            )
            config = RunConfig(
                corpus,
                model,
                ScoringOptions(batch_tokens=batch_tokens, split_chars=True, long_texts=long_texts),
                folder.subfolder(sub),
            )
            if sub == SITES_RUN:
                assert vocabulary is not None
                found, passes = _site_tables(config, vocabulary, inputs, ray, overwrite, texts)
            else:
                found, passes = _plls(config, ray, overwrite, texts)
        alphabet = vocabulary.alphabet if vocabulary else ""
        scored = [
            variant_scores(a.assay.id, a.assay.target_seq, a.variants, inputs.strategy, found, alphabet) for a in read
        ]
        summary = _summary(read, scored, inputs, model, passes, began)
        _write(folder, read, scored, summary)
    return summary


def _digest(texts: pa.Table) -> str:
    """SHA-256 of what the model is to read (ids, sequences, sites), in order."""
    digest = hashlib.sha256()
    for row in zip(*(texts[c].to_pylist() for c in texts.column_names)):
        digest.update(("\t".join(map(str, row)) + "\n").encode())
    return digest.hexdigest()


def _assays(inputs: VariantsInputs) -> list[Assay]:
    if inputs.reference is not None:
        return read_reference(inputs.reference, inputs.table)
    assay_id = file_name(inputs.table).split(".")[0]
    return [Assay(assay_id, inputs.table, inputs.target_seq.strip().upper())]


def _read_assay(assay: Assay, inputs: VariantsInputs, vocabulary: ResidueVocabulary | None) -> AssayRows:
    """The assay's table and each row's variant. A table without mutants, with a column the output adds, or naming
    a mutant twice is refused by checks that read it a block at a time (holding a key per distinct variant), so a
    table is held whole only once it is to be scored."""
    columns = table_columns(assay.table)
    clash = [c for c in ADDED[1:] if c in columns]
    if clash:
        raise DMSError(f"{assay.table} already has the column(s) {clash}, which the output adds: rename them")
    named = [c for c in (MUTANT, MUTATED_SEQUENCE) if c in columns]  # a row's variant: its mutant, else its sequence
    if not named:
        raise DMSError(
            f"{assay.table} has neither a `{MUTANT}` nor a `{MUTATED_SEQUENCE}` column: pass a ProteinGym DMS table"
        )
    refuse_repeats(_variant_names(table_batches(assay.table, named), named), assay.table)
    table = read_table(assay.table)
    n = table.num_rows
    mutants = strings_of(table, MUTANT) if MUTANT in named else [None] * n
    given = strings_of(table, MUTATED_SEQUENCE) if MUTATED_SEQUENCE in named else [None] * n
    target, strategy, offset = assay.target_seq, inputs.strategy, inputs.offset
    return AssayRows(
        assay, table, [read_variant(m, g, target, strategy, offset, vocabulary) for m, g in zip(mutants, given)]
    )


def _variant_names(batches: Iterator[pa.Table | pa.RecordBatch], named: list[str]) -> Iterator[str | None]:
    """Each row's first value of the `named` columns that is not empty, in the table's order."""
    for batch in batches:
        for values in zip(*(strings_of(batch, c) for c in named)):
            yield next((v for v in values if v is not None), None)


def _site_tables(
    config: RunConfig,
    vocabulary: ResidueVocabulary,
    inputs: VariantsInputs,
    ray: RayOptions | None,
    overwrite: bool,
    sequences: pa.Table,
) -> tuple[dict[str, Any], int]:
    """The site tables by their row's id ({position: log-probs}, or the row's error) and the passes they cost."""
    masked, scoring = inputs.strategy == "masked-marginal", config.scoring
    windows = inputs.windows
    workload = site_workload(config.model, masked, vocabulary, scoring.batch_tokens, scoring.long_texts, windows)
    run(config, workload, ray, overwrite)
    rows = OutputDir(config.output).read_rows([S.ID, S.TEXT, S.STATUS, S.ERROR, "positions", "logprobs", PASSES])
    expected = dict(zip(sequences[S.ID].to_pylist(), sequences[S.TEXT].to_pylist()))
    _check_joined(config.output, rows, expected)
    found = found_tables(rows.to_pylist(), vocabulary.alphabet)
    return found, int(pc.sum(rows[PASSES]).as_py() or 0)


def _plls(
    config: RunConfig, ray: RayOptions | None, overwrite: bool, sequences: pa.Table
) -> tuple[dict[str, Any], int]:
    """The PLL of each distinct sequence (or its row's error), by sequence, and the masked copies they cost."""
    score(config, ray, overwrite)
    rows = OutputDir(config.output).read_rows([S.ID, S.TEXT, S.PLL, S.N_TOKENS, S.N_UNKNOWN, S.STATUS, S.ERROR])
    expected = dict(zip(sequences[S.ID].to_pylist(), sequences[S.TEXT].to_pylist()))
    _check_joined(config.output, rows, expected)
    found = found_plls(rows.to_pylist())
    ok = pc.equal(rows[S.STATUS], S.STATUS_OK)
    return found, int(pc.sum(pc.if_else(ok, rows[S.N_TOKENS], 0)).as_py() or 0)


def _check_joined(output: str, rows: pa.Table, expected: dict[str, str]) -> None:
    """Every row of the sub-run is one of this run's sequences, under its own id, each once: the join is by key,
    and a folder holding another run's rows is refused, not joined."""
    ids, texts = rows[S.ID].to_pylist(), rows[S.TEXT].to_pylist()
    wrong = [(i, t) for i, t in zip(ids, texts) if expected.get(i) != t]
    if wrong or len(set(ids)) != len(ids) or set(ids) != set(expected):
        shown = wrong[0][0] if wrong else "(ids)"
        raise UserError(
            f"{output} holds rows that are not this run's sequences (e.g. {shown!r}): another run wrote there; "
            "pass --overwrite to score afresh"
        )


def _summary(
    read: list[AssayRows],
    scored: list[list[tuple[float | None, str | None]]],
    inputs: VariantsInputs,
    model: ModelSpec,
    passes: int,
    began: float,
) -> dict:
    """The run's figures; `seconds` from `began` (the command's start) to the statistics, included."""
    by_assay = {a.assay.id: _assay_figures(a, rows) for a, rows in zip(read, scored)}
    n = sum(len(r) for r in scored)
    ok = sum(1 for rows in scored for s, _ in rows if s is not None)
    summary = {
        "strategy": inputs.strategy,
        "model": model.name,
        "offset": inputs.offset,
        "assays": len(read),
        "variants": n,
        "ok": ok,
        "errors": n - ok,
        "forward_passes": passes,
        "seconds": round(time.monotonic() - began, 3),
        "by_assay": by_assay,
    }
    if inputs.reference is not None:  # ProteinGym's averages group the assays by the reference file's columns
        placed = [_benchmark_assay(a.assay, by_assay[a.assay.id]) for a in read]
        summary["proteingym"] = {inputs.strategy: benchmark(placed)}
    return summary


def _assay_figures(read: AssayRows, rows: list[tuple[float | None, str | None]]) -> dict:
    """The assay's counts and ProteinGym's five figures, over it and by mutation depth; Spearman and AUC with the
    project's own bootstrap interval where they are defined."""
    scores = np.asarray([np.nan if s is None else s for s, _ in rows])
    figures: dict[str, Any] = {
        "target_length": len(read.assay.target_seq),
        "variants": len(rows),
        "ok": int(np.isfinite(scores).sum()),
    }
    measured, labels = (_measurements(read.table, c) for c in (DMS_SCORE, DMS_SCORE_BIN))
    depths = [depth_group(v.key) if s is not None and v.key else None for v, (s, _) in zip(read.variants, rows)]
    assay, by_depth = assay_figures(Measurements(scores, measured, labels, depths))
    for values, name, statistic in ((measured, "spearman", spearman), (labels, "auc", auc)):
        both = np.isfinite(scores) & (np.isfinite(values) if not isinstance(values, str) else False)
        if assay[name].value is None:  # ProteinGym's reason; no bootstrap of an undefined figure
            null = assay[name].to_dict()
            earlier = {"why": null["reason"]} if "reason" in null else {}  # its name in earlier summaries, kept
            figures[name] = {**Estimate(None, None, None, int(both.sum())).to_dict(), **null, **earlier}
        else:
            figures[name] = estimate(statistic, scores[both], values[both]).to_dict()
    figures.update({m: assay[m].to_dict() for m in METRICS if m not in figures})
    figures["by_depth"] = {d: {m: f.to_dict() for m, f in of_depth.items()} for d, of_depth in by_depth.items()}
    return figures


def _measurements(table: pa.Table, column: str) -> np.ndarray | str:
    """A measurement column as floats (NaN where missing), or why the assay has none to use."""
    if column not in table.column_names:
        return f"the table has no {column} column"
    values = numbers_of(table, column)
    return values if isinstance(values, str) else np.asarray([np.nan if v is None else v for v in values])


def _benchmark_assay(assay: Assay, figures: dict) -> BenchmarkAssay:
    """An assay's figures as ProteinGym's averages take them: by metric, and by `metric_depth`."""
    values = {m: figures[m]["value"] for m in METRICS}
    for depth, of_depth in figures["by_depth"].items():
        values.update({f"{m}_{depth}": f["value"] for m, f in of_depth.items()})
    return BenchmarkAssay(assay.id, assay.uniprot_id, assay.selection_type, values)


def _write(
    folder: Claim, read: list[AssayRows], scored: list[list[tuple[float | None, str | None]]], summary: dict
) -> None:
    tables = []
    for a, rows in zip(read, scored):
        table = a.table
        if DMS_ID not in table.column_names:
            table = table.append_column(DMS_ID, pa.array([a.assay.id] * table.num_rows, pa.string()))
        n_mutations = [len(v.sites) if v.sites and e is None else None for v, (_, e) in zip(a.variants, rows)]
        table = table.append_column(SCORE, pa.array([s for s, _ in rows], pa.float64()))
        table = table.append_column(N_MUTATIONS, pa.array(n_mutations, pa.int32()))
        table = table.append_column(
            S.STATUS, pa.array([S.STATUS_OK if e is None else S.STATUS_ERROR for _, e in rows], pa.string())
        )
        table = table.append_column(S.ERROR, pa.array([e for _, e in rows], pa.string()))
        tables.append(table)
    variants = _stacked(tables)
    folder.write_table("variants.parquet", variants)
    folder.write_json(SUMMARY_FILE, summary)
    write_report(folder, variants, summary)


def _stacked(tables: list[pa.Table]) -> pa.Table:
    """The assays' rows in one table. A column the tables give types Arrow cannot widen into one (a `DMS_score`
    of numbers in one table and of words in another) is written as strings, each value as its table holds it."""
    fields: dict[str, set[pa.Field]] = {}
    for table in tables:
        for field in table.schema:
            fields.setdefault(field.name, set()).add(field.with_nullable(True))
    mixed = {name for name, kinds in fields.items() if len(kinds) > 1 and not _widened(kinds)}
    as_strings = [
        _with_strings(table, [c for c in table.column_names if c in mixed]) if mixed else table for table in tables
    ]
    return pa.concat_tables(as_strings, promote_options="permissive")


def _widened(fields: set[pa.Field]) -> bool:
    """Whether Arrow's permissive promotion makes one type of these (int64 and float64 do; float64 and string
    do not)."""
    try:
        pa.unify_schemas([pa.schema([f]) for f in fields], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return False
    return True


def _with_strings(table: pa.Table, columns: list[str]) -> pa.Table:
    for name in columns:
        values = [None if v is None else str(v) for v in table[name].to_pylist()]
        table = table.set_column(table.column_names.index(name), name, pa.array(values, pa.string()))
    return table
