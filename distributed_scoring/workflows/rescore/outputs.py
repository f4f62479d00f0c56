"""What N-best rescoring produces (`rescoring.rescore`): the tuned weights and tables (`Rescored`), the
columns and schemas of those tables, and the files `write_outputs` writes: hypotheses.parquet,
best.parquet, one 1-best text file per split, report.json and report.md (`render_rescore_report`), and
the test list written back in its own format (`TestList`, `RESCORED_STEM`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ...io import schema as S
from ...io.claim import Claim
from ...io.nbest import HYP_ID, NBEST_SCHEMA, REF, SCORE, TEXT, UTT_ID
from ...io.nbest_formats import RescoredHypothesis, rescored_files
from ...io.output import REPORT_JSON, REPORT_MD

SPLITS = ("dev", "test")

# Columns of the rescored tables (the N-best columns keep their `nbest` names).
SPLIT = "split"
SEQ_LP = "seq_lp"  # length penalty of the sequence score
PLL = S.PLL
MLM_TOKENS = "mlm_tokens"  # |W| in the masked LM's tokens
MLM_LP = "mlm_lp"
CAUSAL_LOGP = "causal_logp"  # log P(W), end-of-sentence term included
CAUSAL_TOKENS = "causal_tokens"  # |W| in the causal LM's tokens
CAUSAL_LP = "causal_lp"
LM_SCORE = "lm_score"  # (1 - gamma) * log P / lp_causal + gamma * PLL / lp_mlm
TOTAL = "total"  # score / seq_lp + lambda * lm_score
RESCORED_RANK = "rescored_rank"  # 1 = the rescored 1-best
BEST = "best"
BASELINE_BEST = "baseline_best"  # the sequence model's own 1-best
BASELINE_HYP_ID = "baseline_hyp_id"

HYPOTHESES_SCHEMA = pa.schema(
    [
        pa.field(SPLIT, pa.string(), nullable=False),
        *NBEST_SCHEMA,
        pa.field(SEQ_LP, pa.float64(), nullable=False),
        pa.field(PLL, pa.float64()),
        pa.field(MLM_TOKENS, pa.int32()),
        pa.field(MLM_LP, pa.float64()),
        pa.field(CAUSAL_LOGP, pa.float64()),
        pa.field(CAUSAL_TOKENS, pa.int32()),
        pa.field(CAUSAL_LP, pa.float64()),
        pa.field(LM_SCORE, pa.float64(), nullable=False),
        pa.field(TOTAL, pa.float64(), nullable=False),
        pa.field(RESCORED_RANK, pa.int32(), nullable=False),
        pa.field(BEST, pa.bool_(), nullable=False),
        pa.field(BASELINE_BEST, pa.bool_(), nullable=False),
    ]
)

BEST_SCHEMA = pa.schema(
    [
        pa.field(SPLIT, pa.string(), nullable=False),
        pa.field(UTT_ID, pa.string(), nullable=False),
        pa.field(HYP_ID, pa.int32(), nullable=False),
        pa.field(TEXT, pa.string(), nullable=False),
        pa.field(REF, pa.string()),
        pa.field(SCORE, pa.float64(), nullable=False),
        pa.field(LM_SCORE, pa.float64(), nullable=False),
        pa.field(TOTAL, pa.float64(), nullable=False),
        pa.field(BASELINE_HYP_ID, pa.int32(), nullable=False),
    ]
)

HYPOTHESES_FILE = "hypotheses.parquet"
BEST_FILE = "best.parquet"


def best_text_file(split: str) -> str:
    return f"{split}.best.txt"


# What `write_outputs` writes into the output folder.
OUTPUT_FILES = (HYPOTHESES_FILE, BEST_FILE, *(best_text_file(split) for split in SPLITS), REPORT_JSON, REPORT_MD)
RESCORED_STEM = "test.rescored"  # the test list in its own format: test.rescored.<ending> (or a folder of that name)

FIRST_APPEARANCE = "utterances in order of first appearance in the N-best input"
# The formats whose readers put utterances in numeric id order (`nbest_formats`), and what their ids are.
NUMERIC_IDS = {
    "fairseq": "fairseq's sample ids",
    "marian": "Marian's source line numbers",
    "moses": "Moses's source line numbers",
}


def best_text_order(formats: dict[str, str]) -> str:
    """How the 1-best text files order their utterances, for the lists' formats by split (told, not `auto`):
    by numeric id for fairseq and Moses/Marian, whose readers sort by it, else as the list gives them."""
    orders = {
        split: f"utterances in numeric id order ({NUMERIC_IDS[fmt]})" if fmt in NUMERIC_IDS else FIRST_APPEARANCE
        for split, fmt in formats.items()
    }
    if len(set(orders.values())) == 1:
        return next(iter(orders.values()))
    return "; ".join(f"{split}: {order}" for split, order in orders.items())


@dataclass(frozen=True)
class TestList:
    """The test N-best list as read: where, its format (told, not `auto`), the table read (with any extra
    column of its format, Moses's `features`) and Kaldi's acoustic scale, to be written back rescored."""

    uri: str
    fmt: str
    table: pa.Table
    kaldi_acwt: float = 1.0


@dataclass(frozen=True)
class Rescored:
    """Tuned weights, every hypothesis with its component scores (`HYPOTHESES_SCHEMA`), the 1-best
    per utterance (`BEST_SCHEMA`, dev then test, utterances in input order) and the report."""

    lam: float
    gamma: float
    alphas: tuple[float, float]
    hypotheses: pa.Table
    best: pa.Table
    report: dict


def write_outputs(result: Rescored, folder: Claim, test_list: TestList | None = None) -> list[str]:
    """Write the hypotheses and 1-best tables, one 1-best text file per split, report.json and report.md
    into the claimed output folder (local path or s3://, gs://, file:// URI), and the test list rescored in
    its own format when given. Returns the paths written."""
    folder.write_table(HYPOTHESES_FILE, result.hypotheses)
    folder.write_table(BEST_FILE, result.best)
    splits = result.best.column(SPLIT).to_pylist()
    texts = result.best.column(TEXT).to_pylist()
    for split in SPLITS:
        folder.write_text(best_text_file(split), "".join(f"{t}\n" for s, t in zip(splits, texts) if s == split))
    folder.write_json(REPORT_JSON, result.report)
    folder.write_text(REPORT_MD, render_rescore_report(result.report))
    written = [*OUTPUT_FILES]
    for name, content in (rescored_list(result, test_list) if test_list else {}).items():
        if isinstance(content, pa.Table):
            folder.write_table(name, content)
        else:
            folder.write_text(name, content)
        written.append(name)
    return [folder.out.path(name) for name in written]


def rescored_list(result: Rescored, test_list: TestList) -> dict[str, str | pa.Table]:
    """The test list's files rescored (`nbest_formats.rescored_files`): every hypothesis's total, LM score
    and rescored rank from the test rows of `result.hypotheses`."""
    test = result.hypotheses.filter(pc.equal(result.hypotheses.column(SPLIT), "test"))
    columns = [test.column(c).to_pylist() for c in (UTT_ID, HYP_ID, TOTAL, LM_SCORE, RESCORED_RANK)]
    rescored = {(u, h): RescoredHypothesis(t, lm, r) for u, h, t, lm, r in zip(*columns)}
    return rescored_files(test_list.uri, test_list.fmt, test_list.table, rescored, RESCORED_STEM, test_list.kaldi_acwt)


def render_rescore_report(report: dict) -> str:
    """A readable summary of `report.json`."""
    wer = report["metric"] == "wer"
    shown = (lambda v: f"{100 * v:.2f}") if wer else (lambda v: f"{v:.2f}")
    label = "WER (%, lower is better)" if wer else "BLEU (higher is better)"
    names = {"mlm": "masked LM (PLL)", "causal": "causal LM (log P)"}
    lms = " + ".join(names[key] for key, used in report["lms"].items() if used)
    o = report["options"]
    grid = report["grid"]
    lines = [
        "# N-best rescoring",
        "",
        f"Metric: {label}. LMs: {lms}. "
        f"Weights tuned on dev: lambda = {report['lambda']:g}, gamma = {report['gamma']:g}"
        + "".join(f", {k} = {report[k]:g}" for k in ("mlm_alpha", "causal_alpha") if report[k] is not None)
        + ".",
        "",
        *_splits_table(report, shown),
    ]
    lines += [
        "",
        "Baseline: the sequence model's own 1-best. Oracle: in each utterance, the hypothesis with "
        + (
            "the fewest word edits."
            if wer
            else "the highest sentence BLEU (corpus BLEU does not decompose over "
            "utterances, so this oracle is approximate)."
        ),
        "",
        "total = score / lp_seq + lambda * [(1 - gamma) * log P / lp_causal + gamma * PLL / lp_mlm], "
        f"lp = ((5 + |W|) / 6) ** alpha, with alpha_seq = {o['seq_alpha']:g}"
        + (f" (sequence lengths: {report['seq_length']})." if report["seq_length"] else "."),
        "",
        f"Grid: lambda from {grid['lambda'][0]:g} to {grid['lambda'][-1]:g} ({len(grid['lambda'])} values), "
        f"gamma {', '.join(f'{g:g}' for g in grid['gamma'])}, {_alpha_grid(grid['alpha'], report['lms'])}. "
        f"Ties: {report['tie_rule']}.",
        "",
        *(f"**Edge:** {edge}" for edge in report["edges"]),
        "",
        f"1-best text files: one line per utterance, {report['best_text_order']}.",
        "",
        f"Signature: `{report['signature']}`",
        "",
    ]
    return "\n".join(lines)


def _alpha_grid(alphas: list[list[float]], lms: dict[str, bool]) -> str:
    """The alphas searched: (mlm, causal) pairs where both LMs were used, else the one LM's values."""
    if lms["mlm"] and lms["causal"]:
        return f"(mlm, causal) alpha {', '.join(str(tuple(a)) for a in alphas)}"
    name, index = ("mlm", 0) if lms["mlm"] else ("causal", 1)
    return f"{name} alpha {', '.join(f'{v:g}' for v in dict.fromkeys(a[index] for a in alphas))}"


def _splits_table(report: dict, shown: Callable[[float], str]) -> list[str]:
    """The report's table: per split, its sizes and the metric of the baseline, the rescored 1-best and
    the oracle (`shown` formats the metric), and how many 1-bests rescoring changed."""
    lines = [
        "| split | utterances | hypotheses | baseline | rescored | oracle | 1-best changed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for split in SPLITS:
        r = report[split]
        lines.append(
            f"| {split} | {r['utterances']} | {r['hypotheses']} | {shown(r['baseline'])} | {shown(r['rescored'])} "
            f"| {shown(r['oracle'])} | {r['changed']} |"
        )
    return lines
