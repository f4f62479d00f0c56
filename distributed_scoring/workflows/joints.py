"""Pairwise joints at scale (`dscore joints`, Torroba-Hennigen et al., 2023): examples drawn from a corpus
or given, conditionals and the five constructions on the scoring actors, a Table-1 style report.

The driver picks the examples: `examples` sentences sampled uniformly (reservoir sampling, seeded, so
memory stays at the sample's size), or every record of a JSONL of given pairs (`text`, `positions: [a,
b]`, optional `id`). They are written to `DIR/examples/examples.parquet` and scored through the same
shard pipeline as `dscore score` (in DIR/scores, the folder held from before the examples are written
until the reports are): the prepare stage tokenises and, for the random-pairs and
contiguous-pairs schemes, draws the two token indices from the sentence's own tokens with a generator
seeded by (seed, id), so results do not depend on sharding. The score stage writes one row per example
and construction; the driver sums `joints.JointStats` per construction into `report.json` / `report.md`.
Positions are 0-based indices into the model's tokens with special tokens excluded.
"""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ..engine.joint_stats import CONSTRUCTIONS, JointOptions, PairMetrics, corpus_stats
from ..io import schema as S
from ..io.claim import claim
from ..io.ids import refuse_repeated
from ..io.inputs import InputError
from ..io.output import REPORT_JSON, REPORT_MD, SUMMARY_FILE, OutputDir
from ..io.sources import plan_shards, read_unit, read_units
from ..io.storage import open_binary
from ..options import check, check_bounds, option
from ..pipeline import runner
from ..workloads.joints import (
    A_KL,
    AG_CHANGE,
    CONSTRUCTION,
    EXAMPLES_SCHEMA,
    G_KL,
    LOG_PAIR,
    LOG_UNARY_A,
    LOG_UNARY_B,
    SCHEMES,
    A,
    B,
    is_pair,
    joints_workload,
)
from ..workloads.prepare import PLLPreparer

logger = logging.getLogger(__name__)

JOINTS = "joints"  # the workload of DIR/_run.json
EXAMPLES_FILE = "examples/examples.parquet"
SCORES_DIR = "scores"  # the scoring run's sub-folder
# What an earlier dscore's joints folder held, without a _run.json of its own (its scoring run had one).
EARLIER_LAYOUT = ("examples", SCORES_DIR, REPORT_JSON, SUMMARY_FILE, REPORT_MD)
METRIC_NAMES = ("U-PPL", "P-PPL", "A-KL", "G-KL")


@dataclass(frozen=True)
class JointsInputs:
    """A text corpus (pairs drawn by `scheme`) or a JSONL of given pairs; `examples` sentences are drawn."""

    paths: tuple[str, ...]
    output: str
    scheme: str = option(
        "random",
        "two tokens uniformly at random, or two adjacent tokens (ignored for given pairs)",
        choices=SCHEMES,
    )
    examples: int = option(1000, "sentences drawn from the corpus (default {default})", low=1)
    seed: int = option(0, "seed of the drawing of sentences and positions")
    text_column: str = "text"
    shard_rows: int = 50

    def __post_init__(self) -> None:
        check(self)
        check_bounds("--shard-rows", self.shard_rows, 1)


def pairwise_joints(
    inputs: JointsInputs,
    model: ModelSpec,
    options: JointOptions,
    batch_tokens: int | None = None,
    top_k: int | None = None,
    ray: RayOptions | None = None,
    overwrite: bool = False,
) -> dict:
    """Draw or read the examples, score them, write the reports; returns summary.json's content, whose
    `report` is report.json's: {scheme: {construction: {"U-PPL", "P-PPL", "A-KL", "G-KL"}}}."""
    check_bounds("--top-k", top_k, 1)  # these two before the examples are drawn and written
    scoring = ScoringOptions(batch_tokens=batch_tokens)
    given = _is_given(inputs.paths)
    scheme = "given" if given else inputs.scheme
    examples = _given_examples(inputs.paths) if given else _sampled_examples(inputs, model)
    run = {
        "workload": JOINTS,
        **{k: v for k, v in asdict(inputs).items() if k != "output"},
        "scheme": scheme,
        "paths": list(inputs.paths),
        "model": model.name,
        "revision": model.revision,
    }
    with claim(inputs.output, inputs.paths, [model.name]) as folder:
        folder.begin(
            run,
            folder.admit(run, overwrite, earlier=EARLIER_LAYOUT),
            [EXAMPLES_FILE, SCORES_DIR, REPORT_JSON, SUMMARY_FILE, REPORT_MD],
        )
        examples_file = folder.write_table(EXAMPLES_FILE, pa.Table.from_pylist(examples, schema=EXAMPLES_SCHEMA))
        config = RunConfig(
            InputSpec((examples_file,), id_column=S.ID, shard_rows=inputs.shard_rows),
            model,
            scoring,
            folder.subfolder(SCORES_DIR),
        )
        workload = joints_workload(model, examples_file, scheme, inputs.seed, options, batch_tokens, top_k)
        runner.run(config, workload, ray, overwrite)
        summary = _summary(config.output, scheme, model, options, top_k)
        folder.write_json(REPORT_JSON, summary["report"])
        folder.write_json(SUMMARY_FILE, summary)
        folder.write_text(REPORT_MD, render_joints_report(summary))
    return summary


# Driver: the examples.


def _is_given(paths: tuple[str, ...]) -> bool:
    """A single JSONL whose first record has `positions`: pairs given explicitly."""
    if len(paths) != 1 or not paths[0].lower().endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return False
    with open_binary(paths[0], seekable=False) as stream:
        for line in stream:
            if line.strip():
                try:
                    return "positions" in json.loads(line)
                except (json.JSONDecodeError, TypeError):
                    return False
    return False


def _given_examples(paths: tuple[str, ...]) -> list[dict]:
    """Every record of the given-pairs JSONL; a malformed one is kept with its error (rows in = rows out). Ids
    that repeat are refused (rows are keyed by them)."""
    rows = []
    name = paths[0].rsplit("/", 1)[-1]
    with open_binary(paths[0], seekable=False) as stream:
        for number, line in enumerate(stream, start=1):
            row_id = f"{name}:{number}"
            try:
                record = json.loads(line)
                row_id = str(record.get("id", row_id))
                a, b = record["positions"]
                if not is_pair(a, b):
                    raise ValueError
                rows.append({S.ID: row_id, S.TEXT: record.get("text"), A: a, B: b, S.ERROR: None})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                rows.append(
                    {
                        S.ID: row_id,
                        S.TEXT: None,
                        A: None,
                        B: None,
                        S.ERROR: "not a record with text and positions [a, b] (two different indices >= 0)",
                    }
                )
    refuse_repeated(
        pa.chunked_array([pa.array([r[S.ID] for r in rows], pa.string())]),
        lambda index: f"{name} line {index + 1}",
        "the given pairs' `id` field",
        "give each pair its own id, or leave `id` out (ids become file:line)",
    )
    return rows


def _sampled_examples(inputs: JointsInputs, model: ModelSpec) -> list[dict]:
    """`examples` scorable sentences (read, and at least two non-special tokens: never a blank line),
    uniformly at random (reservoir sampling), in id order."""
    from ..engine.model_files import load_tokenizer

    preparer = PLLPreparer(*load_tokenizer(model))
    spec = InputSpec(inputs.paths, inputs.text_column, shard_rows=10_000)
    rng = random.Random(inputs.seed)
    sample: list[dict] = []
    seen = 0
    for unit in read_units(plan_shards(spec)):
        for _, rows in read_unit(unit, spec):
            for row in _pairable(rows, preparer):
                seen += 1
                if len(sample) < inputs.examples:
                    sample.append(row)
                elif (slot := rng.randrange(seen)) < inputs.examples:
                    sample[slot] = row
    if not sample:
        raise InputError(f"no sentence of two or more tokens in {', '.join(inputs.paths)}: check --text-column")
    logger.info("drew %d of %d sentences", len(sample), seen)
    return [{**row, A: None, B: None, S.ERROR: None} for row in sorted(sample, key=lambda r: r[S.ID])]


def _pairable(rows: pa.Table, preparer: PLLPreparer) -> list[dict]:
    """The id and text of read rows that tokenise into at least the two tokens a pair needs."""
    ok = rows.filter(pc.equal(rows[S.STATUS], S.STATUS_OK)).select([S.ID, S.TEXT]).to_pylist()
    prepared = preparer.prepare_texts([row[S.TEXT] for row in ok])
    return [row for row, p in zip(ok, prepared) if p.error is None and len(p.targets) >= 2]


# Driver: the report.


def _summary(scores_dir: str, scheme: str, model: ModelSpec, options: JointOptions, top_k: int | None) -> dict:
    table = OutputDir(scores_dir).read_rows(
        [CONSTRUCTION, S.STATUS, LOG_PAIR, LOG_UNARY_A, LOG_UNARY_B, A_KL, G_KL, AG_CHANGE]
    )
    ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK))
    totals = corpus_stats(
        {r[CONSTRUCTION]: PairMetrics(r[LOG_PAIR], r[LOG_UNARY_A], r[LOG_UNARY_B], r[A_KL], r[G_KL])}
        for r in ok.to_pylist()
    )
    changes = [c for c in ok[AG_CHANGE].to_pylist() if c is not None]
    examples = table.num_rows // len(CONSTRUCTIONS)
    return {
        "report": {
            scheme: {
                name: {"U-PPL": s.u_ppl, "P-PPL": s.p_ppl, "A-KL": s.a_kl, "G-KL": s.g_kl} for name, s in totals.items()
            }
        },
        "scheme": scheme,
        "examples": examples,
        "scored": totals["MLM"].n,
        "errors": examples - totals["MLM"].n,
        "model": model.name,
        "ag": {
            "iterations": options.ag_iterations,
            "last_change_max": max(changes, default=None),
            "last_change_mean": sum(changes) / len(changes) if changes else None,
        },
        "hcb_pivot": options.pivot,
        "vocabulary": "all token ids" if top_k is None else f"gold + top-{top_k} candidates (approximation)",
    }


def render_joints_report(summary: dict) -> str:
    """The paper's Table 1 layout: constructions as rows, scheme x metric as columns."""
    report = summary["report"]
    schemes = [s for s in ("random", "contiguous", "given") if s in report]
    header = "| construction | " + " | ".join(f"{s} {m}" for s in schemes for m in METRIC_NAMES) + " |"
    lines = [
        f"# Pairwise joints: {summary['model']}",
        "",
        f"{summary['scored']} examples scored ({summary['errors']} errors); natural log; lower is better. "
        f"AG: {summary['ag']['iterations']} iterations, last change max {_fmt(summary['ag']['last_change_max'])}. "
        f"HCB pivot: {summary['hcb_pivot']}. Vocabulary: {summary['vocabulary']}.",
        "",
        header,
        "|---|" + "---:|" * (len(schemes) * len(METRIC_NAMES)),
    ]
    for name in CONSTRUCTIONS:
        cells = [_fmt(report[s][name][m]) for s in schemes for m in METRIC_NAMES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.4g}"
