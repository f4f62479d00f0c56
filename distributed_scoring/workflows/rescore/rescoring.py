"""N-best rescoring with LM scores: the log-linear combination, weight tuning on dev, WER/BLEU, reports.

Salazar et al. (2020), sec. 3.1, 4.3 and appendices A, D. Every hypothesis W of an utterance gets

    total(W) = s(W) / lp_seq(W) + lambda * [ (1 - gamma) * log P(W) / lp_causal(W) + gamma * PLL(W) / lp_mlm(W) ]

with s the sequence model's log-score, PLL the masked LM's pseudo-log-likelihood, log P the causal
LM's log-probability, and the GNMT length penalty lp(W) = ((5 + |W|) / 6) ** alpha, each LM's |W|
counted in that LM's own tokens (alpha = 0 turns a penalty off). With one LM only, gamma is fixed
(1 for the MLM, 0 for the causal LM).

Defaults follow the paper's own use of length normalisation: its ASR runs apply none (WER: alpha = 0 on
the LM scores), and its NMT runs (sec. 4.3, appendix A) normalise both the sequence score (alpha =
0.6, `seq_alpha`) and the PLL (alpha = 1.0). For BLEU the LM alpha is therefore searched on dev jointly
with the weights, over `BLEU_ALPHAS` (0 included, the paper's 1.0 the top); an explicit `mlm_alpha` /
`causal_alpha` fixes it. A penalty on by default for WER would reward long hypotheses' PLL per token
and, as seen on real N-best lists, can cancel what the MLM brings.

The weights are tuned on dev by grid search (lambda in steps of 0.05 up to `lambda_max`, gamma in
steps of 0.1), minimising corpus WER (ASR) or maximising corpus BLEU (MT); among equally good points
the largest lambda wins, then the largest gamma, then the smallest alpha (appendix A). The search never
stops silently at the grid's edge: while the best lambda is the largest searched and the metric still
improved there, the lambda range is doubled (20 more points each time) up to `lambda_limit`, and the
report says when an optimum lies on an edge of what was searched. Within an utterance, equal totals
go to the sequence model's better rank. The search is fast because each hypothesis's metric sufficient
statistics (word edits and reference words; BLEU n-gram matches and lengths) are computed once with
jiwer/sacrebleu, and each grid point only takes an argmax per utterance (numpy, all utterances at
once) and sums the chosen statistics.

The caller scores every UNIQUE hypothesis text once per LM and passes `{text: TextScore}` mappings
(`text_scores` builds one from a scorer's output table).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Mapping, NamedTuple

import numpy as np
import pyarrow as pa

from ...io import schema as S
from ...config import check_bounds
from ...errors import UserError
from ...io.claim import Claim
from .metrics import Metric, metric_for
from ...io.nbest import HYP_ID, NBEST_SCHEMA, REF, SCORE, SEQ_LEN, TEXT, UTT_ID, NBestError, require_references

logger = logging.getLogger(__name__)

METRICS = ("wer", "bleu")
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
REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def best_text_file(split: str) -> str:
    return f"{split}.best.txt"


# What `write_outputs` writes into the output folder.
OUTPUT_FILES = (HYPOTHESES_FILE, BEST_FILE, *(best_text_file(split) for split in SPLITS), REPORT_JSON, REPORT_MD)


class TextScore(NamedTuple):
    """One LM's sentence score of a hypothesis text: PLL or log P, and |W| in that LM's tokens."""

    logprob: float
    n_tokens: int


BLEU_ALPHAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # LM length-penalty exponents searched for BLEU
# Bounds of the tuning flags: a length-penalty exponent past 10 overflows ((5 + |Y|) / 6) ** alpha for long
# hypotheses, and an LM weight past 1000 leaves the sequence model's score no say (the grid would be huge).
MAX_ALPHA = 10.0
MAX_LAMBDA = 1000.0
EXTENSION_POINTS = 20  # lambda values added each time the range is doubled


@dataclass(frozen=True)
class RescoreOptions:
    """How hypotheses are combined and how the weights are tuned (see the module docstring).

    `metric`: `wer` (ASR, minimised) or `bleu` (MT, maximised). `mlm_alpha`, `causal_alpha`: GNMT
    length-penalty exponents of the LM scores; None means 0 for WER and searched over `BLEU_ALPHAS` for
    BLEU. `seq_alpha` normalises the sequence score (0 for ASR, 0.6 for NMT in the paper). Lambda runs
    over 0, step, ..., lambda_max, extended up to `lambda_limit` while the dev optimum sits on the top
    edge; gamma over 0, step, ..., 1 when both LMs are given. `bleu_tokenize` is sacrebleu's tokenizer
    (`none` for text that is already tokenised, as the paper's tokenised BLEU).
    """

    metric: str = "wer"
    mlm_alpha: float | None = None
    causal_alpha: float | None = None
    seq_alpha: float = 0.0
    lambda_max: float = 1.0
    lambda_limit: float = 64.0
    lambda_step: float = 0.05
    gamma_step: float = 0.1
    bleu_tokenize: str = "13a"
    bleu_lowercase: bool = False

    def __post_init__(self) -> None:
        from sacrebleu.metrics import BLEU

        if self.metric not in METRICS:
            raise UserError(f"metric {self.metric!r} is not one of {METRICS} (wer for ASR, bleu for MT)")
        for flag, value in (("--mlm-alpha", self.mlm_alpha), ("--causal-alpha", self.causal_alpha),
                            ("--seq-alpha", self.seq_alpha)):
            check_bounds(flag, value, 0, MAX_ALPHA)
        check_bounds("--lambda-max", self.lambda_max, 0, MAX_LAMBDA)
        check_bounds("--lambda-limit", self.lambda_limit, 0, MAX_LAMBDA)
        if not self.lambda_limit >= self.lambda_max:
            raise UserError(f"lambda_limit ({self.lambda_limit}) must be at least lambda_max ({self.lambda_max})")
        for name in ("lambda_step", "gamma_step"):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.bleu_tokenize not in BLEU.TOKENIZERS:
            raise UserError(f"bleu_tokenize {self.bleu_tokenize!r} is not one of sacrebleu's {sorted(BLEU.TOKENIZERS)}")

    def lambdas(self) -> np.ndarray:
        return _steps(self.lambda_max, self.lambda_step)

    def gammas(self, mlm: bool, causal: bool) -> np.ndarray:
        if mlm and causal:
            return _steps(1.0, self.gamma_step)
        return np.array([1.0 if mlm else 0.0])

    def alphas(self, mlm: bool, causal: bool) -> list[tuple[float, float]]:
        """The (mlm alpha, causal alpha) pairs searched: fixed where given, else 0 (WER) or `BLEU_ALPHAS`
        (BLEU) for every LM in use whose alpha is not given."""
        free = (mlm and self.mlm_alpha is None) or (causal and self.causal_alpha is None)
        searched = BLEU_ALPHAS if self.metric == "bleu" and free else (0.0,)
        return [(a if self.mlm_alpha is None else self.mlm_alpha, a if self.causal_alpha is None else self.causal_alpha)
                for a in searched]


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


def length_penalty(n_tokens: np.ndarray, alpha: float) -> np.ndarray:
    """GNMT length penalty ((5 + |W|) / 6) ** alpha (Wu et al., 2016); 1 everywhere for alpha = 0."""
    return ((5.0 + np.asarray(n_tokens, dtype=np.float64)) / 6.0) ** alpha


def text_scores(table: pa.Table, score_column: str, name: str, count_column: str = S.N_TOKENS) -> dict[str, TextScore]:
    """{text: TextScore} from a scorer's output table (`pll` of the MLM scorer, `logp` of the causal one).

    A row the LM could not score (status `error`) is refused with its reason: every hypothesis needs a
    score. A text listed twice keeps its first score (batching does not change scores).
    """
    missing = [c for c in (S.TEXT, score_column, count_column) if c not in table.column_names]
    if missing:
        raise UserError(f"{name} scores lack the column(s) {missing}; found {table.column_names}")
    texts = table.column(S.TEXT).to_pylist()
    scores = table.column(score_column).to_pylist()
    counts = table.column(count_column).to_pylist()
    has_status = S.STATUS in table.column_names
    status = table.column(S.STATUS).to_pylist() if has_status else [S.STATUS_OK] * len(texts)
    errors = table.column(S.ERROR).to_pylist() if S.ERROR in table.column_names else [None] * len(texts)
    failed = [(t, e) for t, st, e, v in zip(texts, status, errors, scores) if st != S.STATUS_OK or v is None]
    if failed:
        shown = "; ".join(f"{t!r}: {e}" for t, e in failed[:5])
        raise UserError(
            f"the {name} could not score {len(failed)} hypothesis texts ({shown}); rescoring needs a score for "
            "every hypothesis: fix or drop those hypotheses in the N-best list"
        )
    out: dict[str, TextScore] = {}
    for text, score, count in zip(texts, scores, counts):
        out.setdefault(text, TextScore(float(score), int(count)))
    return out


def rescore(
    dev: pa.Table,
    test: pa.Table,
    mlm: Mapping[str, TextScore] | None = None,
    causal: Mapping[str, TextScore] | None = None,
    options: RescoreOptions | None = None,
) -> Rescored:
    """Tune lambda (and gamma) on `dev`, apply them to `test`, and report baseline/rescored/oracle.

    `dev` and `test` are `nbest.NBEST_SCHEMA` tables with a reference for every utterance; `mlm` and
    `causal` map every hypothesis text of both to its score (at least one of them is needed).
    """
    if mlm is None and causal is None:
        raise UserError("rescoring needs the scores of at least one LM (masked or causal)")
    options = options or RescoreOptions()
    metric = metric_for(options.metric, options.bleu_tokenize, options.bleu_lowercase)
    splits = [_Split.build(name, table, mlm, causal, options, metric) for name, table in zip(SPLITS, (dev, test))]
    search = _search(splits[0], options, mlm is not None, causal is not None, metric)
    lam, gamma, alphas = search.best
    results = [split.result(lam, gamma, alphas, metric) for split in splits]
    summaries = {split.name: result.summary for split, result in zip(splits, results)}
    logger.info("tuned on dev: lambda=%s gamma=%s alpha=%s; %s", lam, gamma, alphas, summaries)
    for edge in search.edges:
        logger.warning("rescoring: %s", edge)
    report = {
        "metric": metric.name,
        "higher_is_better": metric.higher_is_better,
        "scale": metric.scale,
        "lambda": lam,
        "gamma": gamma,
        "mlm_alpha": alphas[0] if mlm is not None else None,
        "causal_alpha": alphas[1] if causal is not None else None,
        **summaries,
        "lms": {"mlm": mlm is not None, "causal": causal is not None},
        "options": asdict(options),
        "seq_length": splits[0].seq_length_source,
        "grid": {"lambda": search.lambdas.tolist(), "gamma": search.gammas.tolist(),
                 "alpha": [list(a) for a in search.alphas], "dev": search.grid.tolist()},
        "edges": search.edges,
        "tie_rule": "largest lambda, then largest gamma, then smallest alpha; within an utterance, the better "
                    "sequence-model rank",
        "best_text_order": "utterances in order of first appearance in the N-best input",
        "signature": metric.signature(),
    }
    return Rescored(
        lam=lam,
        gamma=gamma,
        alphas=alphas,
        hypotheses=pa.concat_tables([r.hypotheses for r in results]),
        best=pa.concat_tables([r.best for r in results]),
        report=report,
    )


def write_outputs(result: Rescored, folder: Claim) -> list[str]:
    """Write the hypotheses and 1-best tables, one 1-best text file per split, report.json and report.md
    into the claimed output folder (local path or s3://, gs://, file:// URI). Returns the paths written."""
    folder.write_table(HYPOTHESES_FILE, result.hypotheses)
    folder.write_table(BEST_FILE, result.best)
    splits = result.best.column(SPLIT).to_pylist()
    texts = result.best.column(TEXT).to_pylist()
    for split in SPLITS:
        folder.write_text(best_text_file(split), "".join(f"{t}\n" for s, t in zip(splits, texts) if s == split))
    folder.write_json(REPORT_JSON, result.report)
    folder.write_text(REPORT_MD, render_markdown(result.report))
    return [folder.out.path(name) for name in OUTPUT_FILES]


def render_markdown(report: dict) -> str:
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
        + "".join(f", {k} = {report[k]:g}" for k in ("mlm_alpha", "causal_alpha") if report[k] is not None) + ".",
        "",
        "| split | utterances | hypotheses | baseline | rescored | oracle | 1-best changed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for split in SPLITS:
        r = report[split]
        lines.append(
            f"| {split} | {r['utterances']} | {r['hypotheses']} | {shown(r['baseline'])} | {shown(r['rescored'])} "
            f"| {shown(r['oracle'])} | {r['changed']} |"
        )
    lines += [
        "",
        "Baseline: the sequence model's own 1-best. Oracle: in each utterance, the hypothesis with "
        + ("the fewest word edits." if wer else "the highest sentence BLEU (corpus BLEU does not decompose over "
           "utterances, so this oracle is approximate)."),
        "",
        "total = score / lp_seq + lambda * [(1 - gamma) * log P / lp_causal + gamma * PLL / lp_mlm], "
        f"lp = ((5 + |W|) / 6) ** alpha, with alpha_seq = {o['seq_alpha']:g}"
        + (f" (sequence lengths: {report['seq_length']})." if report["seq_length"] else "."),
        "",
        f"Grid: lambda from {grid['lambda'][0]:g} to {grid['lambda'][-1]:g} ({len(grid['lambda'])} values), "
        f"gamma {', '.join(f'{g:g}' for g in grid['gamma'])}, (mlm, causal) alpha "
        f"{', '.join(str(tuple(a)) for a in grid['alpha'])}. Ties: {report['tie_rule']}.",
        "",
        *(f"**Edge:** {edge}" for edge in report["edges"]),
        "",
        f"1-best text files: one line per utterance, {report['best_text_order']}.",
        "",
        f"Signature: `{report['signature']}`",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class _SplitResult:
    """One split's figures (baseline, rescored, oracle, counts) and output rows."""

    summary: dict
    hypotheses: pa.Table
    best: pa.Table


@dataclass(frozen=True)
class _Split:
    """One N-best table laid out for the search: utterance u's hypotheses fill row u of (U, N) matrices
    in rank order; padding cells have seq = -inf so they are never chosen."""

    name: str
    table: pa.Table  # NBEST rows, by utterance (first appearance) then rank
    utt: np.ndarray  # (H,) utterance index of each row
    slot: np.ndarray  # (H,) position of each row within its utterance
    seq: np.ndarray  # (U, N) score / lp_seq
    mlm: tuple[np.ndarray, np.ndarray]  # (U, N) PLL and (U, N) |W| in MLM tokens (0 without an MLM)
    causal: tuple[np.ndarray, np.ndarray]  # (U, N) log P and |W| in causal tokens (0 without a causal LM)
    stats: np.ndarray  # (U, N, K) metric statistics
    columns: dict  # per-row component columns for the output table
    seq_length_source: str | None

    @classmethod
    def build(
        cls,
        name: str,
        table: pa.Table,
        mlm: Mapping[str, TextScore] | None,
        causal: Mapping[str, TextScore] | None,
        options: RescoreOptions,
        metric: Metric,
    ) -> "_Split":
        table = _ordered(name, table)
        require_references(table, name)
        utt, slot = _positions(table.column(UTT_ID).to_pylist())
        texts = table.column(TEXT).to_pylist()
        score = table.column(SCORE).to_numpy()
        seq_lengths, source = _seq_lengths(name, table, options.seq_alpha)
        seq_lp = length_penalty(seq_lengths, options.seq_alpha)
        columns: dict[str, np.ndarray | pa.Array] = {SEQ_LP: seq_lp}
        lm_terms = {}
        for key, scores, cols in (
            ("masked LM", mlm, (PLL, MLM_TOKENS)),
            ("causal LM", causal, (CAUSAL_LOGP, CAUSAL_TOKENS)),
        ):
            if scores is None:
                columns.update({c: pa.nulls(len(texts), HYPOTHESES_SCHEMA.field(c).type) for c in cols})
                lm_terms[key] = (np.zeros(len(texts)), np.zeros(len(texts), dtype=np.int64))
                continue
            logprob, n_tokens = _lookup(name, key, texts, scores)
            columns.update(zip(cols, (logprob, n_tokens)))
            lm_terms[key] = (logprob, n_tokens)
        refs = table.column(REF).to_pylist()
        shape = (int(utt.max()) + 1, int(slot.max()) + 1)
        return cls(
            name=name,
            table=table,
            utt=utt,
            slot=slot,
            seq=_pad(score / seq_lp, utt, slot, shape, -np.inf),
            mlm=tuple(_pad(v, utt, slot, shape, 0) for v in lm_terms["masked LM"]),
            causal=tuple(_pad(v, utt, slot, shape, 0) for v in lm_terms["causal LM"]),
            stats=_pad(metric.statistics(refs, texts), utt, slot, shape, 0),
            columns=columns,
            seq_length_source=source,
        )

    def lm(self, gamma: float, alphas: tuple[float, float]) -> np.ndarray:
        """(U, N) the LM term: (1 - gamma) * log P / lp_causal + gamma * PLL / lp_mlm."""
        mlm = self.mlm[0] / length_penalty(self.mlm[1], alphas[0])
        causal = self.causal[0] / length_penalty(self.causal[1], alphas[1])
        return (1.0 - gamma) * causal + gamma * mlm

    def choose(self, lam: float, lm: np.ndarray) -> np.ndarray:
        """(U,) slot of each utterance's 1-best given the (U, N) LM term; argmax takes the first
        (best-ranked) of equal totals."""
        return np.argmax(self.seq + lam * lm, axis=1)

    def totals(self, choice: np.ndarray) -> np.ndarray:
        """(K,) metric statistics summed over the chosen hypotheses."""
        return self.stats[np.arange(len(choice)), choice].sum(axis=0)

    def result(self, lam: float, gamma: float, alphas: tuple[float, float], metric: Metric) -> _SplitResult:
        lm = self.lm(gamma, alphas)
        chosen = self.choose(lam, lm)
        baseline = self.choose(0.0, lm)
        sentence = np.where(np.isfinite(self.seq), 0.0, -np.inf)  # (U, N) padding never wins
        sentence[self.utt, self.slot] = metric.sentence(self.stats[self.utt, self.slot])
        oracle = np.argmax(sentence, axis=1)
        summary = {
            "baseline": metric.corpus(self.totals(baseline)),
            "rescored": metric.corpus(self.totals(chosen)),
            "oracle": metric.corpus(self.totals(oracle)),
            "utterances": len(chosen),
            "hypotheses": self.table.num_rows,
            "changed": int((chosen != baseline).sum()),
        }
        return _SplitResult(summary, *self._tables(lam, lm, alphas, chosen, baseline))

    def _tables(
        self, lam: float, lm: np.ndarray, alphas: tuple[float, float], chosen: np.ndarray, baseline: np.ndarray
    ) -> tuple[pa.Table, pa.Table]:
        """(HYPOTHESES_SCHEMA rows, BEST_SCHEMA rows) of this split at the tuned weights; `lm` is (U, N)."""
        padded = self.seq + lam * lm  # (U, N) totals, -inf on padding
        total = padded[self.utt, self.slot]  # (H,)
        # Rank within the utterance: stable sort by -total keeps the sequence model's order among ties.
        order = np.argsort(-padded, axis=1, kind="stable")
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(order.shape[1])[None, :], axis=1)
        is_best = chosen[self.utt] == self.slot
        hypotheses = {
            SPLIT: [self.name] * self.table.num_rows,
            **{c: self.table.column(c) for c in NBEST_SCHEMA.names},
            **self.columns,
            MLM_LP: self._penalty(self.mlm, alphas[0]),
            CAUSAL_LP: self._penalty(self.causal, alphas[1]),
            LM_SCORE: lm[self.utt, self.slot],
            TOTAL: total,
            RESCORED_RANK: ranks[self.utt, self.slot] + 1,
            BEST: is_best,
            BASELINE_BEST: baseline[self.utt] == self.slot,
        }
        rows = np.flatnonzero(is_best)  # one per utterance, in utterance order
        hyp_ids = self.table.column(HYP_ID).to_numpy()
        first = np.flatnonzero(self.slot == 0)  # each utterance's first row
        best = {
            SPLIT: [self.name] * len(rows),
            **{c: self.table.column(c).take(rows) for c in (UTT_ID, HYP_ID, TEXT, REF, SCORE)},
            LM_SCORE: lm[self.utt, self.slot][rows],
            TOTAL: total[rows],
            BASELINE_HYP_ID: hyp_ids[first + baseline],
        }
        return (
            pa.Table.from_pydict(hypotheses, schema=HYPOTHESES_SCHEMA),
            pa.Table.from_pydict(best, schema=BEST_SCHEMA),
        )

    def _penalty(self, lm: tuple[np.ndarray, np.ndarray], alpha: float) -> pa.Array:
        """(H,) each hypothesis's length penalty under one LM; null where that LM was not used."""
        used = self.columns[PLL if lm is self.mlm else CAUSAL_LOGP]
        if isinstance(used, pa.Array) and used.null_count == len(used):
            return used.cast(pa.float64())
        return pa.array(length_penalty(lm[1][self.utt, self.slot], alpha))


@dataclass(frozen=True)
class _Search:
    """The dev grid (alpha, gamma, lambda) as finally searched, its best point and what lay on an edge."""

    lambdas: np.ndarray
    gammas: np.ndarray
    alphas: list[tuple[float, float]]
    grid: np.ndarray  # (n_alpha, n_gamma, n_lambda) corpus metric on dev
    best: tuple[float, float, tuple[float, float]]  # lambda, gamma, alphas
    edges: list[str]


def _search(split: _Split, options: RescoreOptions, mlm: bool, causal: bool, metric: Metric) -> _Search:
    """Grid search on dev. While the best lambda is the top of the range, the range is doubled (up to
    `options.lambda_limit`); the larger values are adopted only when one of them is strictly better, so a
    plateau of equal figures keeps its tie-rule choice instead of running to the limit."""
    lambdas, gammas, alphas = options.lambdas(), options.gammas(mlm, causal), options.alphas(mlm, causal)
    grid = _grid(split, lambdas, gammas, alphas, metric)
    adopted = len(lambdas)  # the best point is picked among lambdas[:adopted]
    best = _pick(grid[:, :, :adopted], lambdas, gammas, alphas, metric.higher_is_better)
    while best[2] == adopted - 1 and lambdas[-1] < options.lambda_limit:
        top = lambdas[-1]
        more = np.round(top + np.arange(1, EXTENSION_POINTS + 1) * (min(2 * top, options.lambda_limit) - top)
                        / EXTENSION_POINTS, 10)
        lambdas = np.concatenate([lambdas, more])
        grid = np.concatenate([grid, _grid(split, more, gammas, alphas, metric)], axis=2)
        wider = _pick(grid, lambdas, gammas, alphas, metric.higher_is_better)
        if not _better(grid[wider], grid[best], metric):
            break
        adopted, best = len(lambdas), wider
    a, g, l = best
    edges = []
    if l == adopted - 1 and l > 0:
        if adopted == len(lambdas):
            edges.append(f"lambda = {lambdas[l]:g} is the largest weight searched (lambda_limit) and the dev metric "
                         "was still improving there: the best weight may lie beyond it; raise --lambda-limit")
        elif grid[a, g, adopted] == grid[a, g, l]:
            edges.append(f"lambda = {lambdas[l]:g} is the largest of the weights searched before a plateau of equally "
                         f"good ones that goes on past it (searched up to {lambdas[-1]:g}, none better)")
    if len(alphas) > 1 and a == len(alphas) - 1:
        edges.append(f"alpha = {alphas[a]} is the largest length-penalty exponent searched")
    return _Search(lambdas, gammas, alphas, grid, (float(lambdas[l]), float(gammas[g]), alphas[a]), edges)


def _better(value: float, other: float, metric: Metric) -> bool:
    return value > other if metric.higher_is_better else value < other


def _grid(split: _Split, lambdas: np.ndarray, gammas: np.ndarray, alphas: list[tuple[float, float]],
          metric: Metric) -> np.ndarray:
    """(n_alpha, n_gamma, n_lambda) corpus metric of the split at every grid point."""
    out = np.empty((len(alphas), len(gammas), len(lambdas)))
    for a, pair in enumerate(alphas):
        for g, gamma in enumerate(gammas):
            lm = split.lm(gamma, pair)  # (U, N)
            for j, lam in enumerate(lambdas):
                out[a, g, j] = metric.corpus(split.totals(split.choose(lam, lm)))
    return out


def _pick(grid: np.ndarray, lambdas: np.ndarray, gammas: np.ndarray, alphas: list, higher_is_better: bool
          ) -> tuple[int, int, int]:
    """Indices (alpha, gamma, lambda) of the best grid point; among exact ties the largest lambda, then the
    largest gamma, then the smallest alpha (appendix A)."""
    objective = grid if higher_is_better else -grid
    found = np.argwhere(objective == objective.max())  # (k, 3)
    a, g, l = max(found.tolist(), key=lambda i: (lambdas[i[2]], gammas[i[1]], -i[0]))
    return a, g, l


def _steps(top: float, step: float) -> np.ndarray:
    """0, step, 2 step, ..., up to `top` inclusive, rounded so that 0.35 prints as 0.35."""
    return np.round(np.arange(int(np.floor(top / step + 1e-9)) + 1) * step, 10)


def _ordered(name: str, table: pa.Table) -> pa.Table:
    """The N-best columns, grouped by utterance (first appearance) and sorted by rank; duplicates refused."""
    missing = [c for c in NBEST_SCHEMA.names if c not in table.column_names]
    if missing:
        raise NBestError(f"{name}: the N-best table lacks the column(s) {missing}; read it with nbest.read_nbest")
    table = table.select(NBEST_SCHEMA.names).cast(NBEST_SCHEMA)
    utt, _ = _positions(table.column(UTT_ID).to_pylist())
    hyp = table.column(HYP_ID).to_numpy()
    order = np.lexsort((hyp, utt))
    pairs = np.stack([utt[order], hyp[order]], axis=1)
    repeated = np.flatnonzero((pairs[1:] == pairs[:-1]).all(axis=1))
    if len(repeated):
        row = order[repeated[0]]
        raise NBestError(
            f"{name}: utterance {table.column(UTT_ID)[int(row)].as_py()!r} has hypothesis {int(hyp[row])} twice "
            f"({len(repeated)} repeated (utt_id, hyp_id) pairs in all); give each hypothesis its own hyp_id"
        )
    return table.take(order)


def _positions(utt_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(utterance index in order of first appearance, position within the utterance) of each row."""
    index: dict[str, int] = {}
    counts: list[int] = []
    utt = np.empty(len(utt_ids), dtype=np.int64)
    slot = np.empty(len(utt_ids), dtype=np.int64)
    for row, u in enumerate(utt_ids):
        i = index.setdefault(u, len(index))
        if i == len(counts):
            counts.append(0)
        utt[row], slot[row] = i, counts[i]
        counts[i] += 1
    return utt, slot


def _pad(values: np.ndarray, utt: np.ndarray, slot: np.ndarray, shape: tuple[int, int], fill) -> np.ndarray:
    """(U, N, ...) matrix of per-row `values` (H, ...), `fill` where an utterance has fewer hypotheses."""
    values = np.asarray(values)
    out = np.full(shape + values.shape[1:], fill, dtype=np.result_type(values.dtype, type(fill)))
    out[utt, slot] = values
    return out


def _seq_lengths(name: str, table: pa.Table, alpha: float) -> tuple[np.ndarray, str | None]:
    """|W| for the sequence score's penalty: the `seq_len` column, else whitespace words (alpha > 0 only)."""
    if alpha == 0:
        return np.zeros(table.num_rows), None
    column = table.column(SEQ_LEN)
    if column.null_count == 0:
        return column.to_numpy().astype(np.float64), "seq_len column"
    if column.null_count < table.num_rows:
        raise NBestError(
            f"{name}: `seq_len` is given for some hypotheses but not for {column.null_count} others; give it "
            "for all (the sequence model's token counts) or for none (whitespace words are used then)"
        )
    return np.array([len(t.split()) for t in table.column(TEXT).to_pylist()], dtype=np.float64), "whitespace words"


def _lookup(name: str, lm: str, texts: list[str], scores: Mapping[str, TextScore]) -> tuple[np.ndarray, np.ndarray]:
    """(H,) log-probabilities and (H,) token counts of the texts; every text must have a score."""
    missing = sorted({t for t in texts if t not in scores})
    if missing:
        shown = "; ".join(repr(t) for t in missing[:5])
        raise UserError(
            f"{name}: {len(missing)} hypothesis texts have no {lm} score (e.g. {shown}); score every unique "
            "hypothesis text of dev and test (nbest.unique_texts) and pass those scores"
        )
    found = [scores[t] for t in texts]
    return np.array([s.logprob for s in found], dtype=np.float64), np.array([s.n_tokens for s in found], dtype=np.int64)
