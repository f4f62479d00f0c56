"""Scores and their combination: each LM's score of a hypothesis text (`TextScore`, `text_scores`), the
GNMT length penalty, and one N-best table laid out as (utterances x hypotheses) matrices (`Split`) on
which the log-linear total of a weight setting, each utterance's 1-best and the summed metric
statistics are a few vectorised operations (the formula is in `rescoring`'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

import numpy as np
import pyarrow as pa

from ...errors import UserError
from ...io import schema as S
from ...io.nbest import HYP_ID, NBEST_SCHEMA, REF, SCORE, SEQ_LEN, TEXT, UTT_ID, NBestError, require_references
from .metrics import Metric
from .outputs import (
    BASELINE_BEST,
    BASELINE_HYP_ID,
    BEST,
    BEST_SCHEMA,
    CAUSAL_LOGP,
    CAUSAL_LP,
    CAUSAL_TOKENS,
    HYPOTHESES_SCHEMA,
    LM_SCORE,
    MLM_LP,
    MLM_TOKENS,
    PLL,
    RESCORED_RANK,
    SEQ_LP,
    SPLIT,
    TOTAL,
)


class TextScore(NamedTuple):
    """One LM's sentence score of a hypothesis text: PLL or log P, and |W| in that LM's tokens."""

    logprob: float
    n_tokens: int


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


@dataclass(frozen=True)
class SplitResult:
    """One split's figures (baseline, rescored, oracle, counts) and output rows."""

    summary: dict
    hypotheses: pa.Table
    best: pa.Table


@dataclass(frozen=True)
class Split:
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
        seq_alpha: float,
        metric: Metric,
    ) -> "Split":
        table = _ordered(name, table)
        require_references(table, name)
        utt, slot = _positions(table.column(UTT_ID).to_pylist())
        texts = table.column(TEXT).to_pylist()
        score = table.column(SCORE).to_numpy()
        seq_lengths, source = _seq_lengths(name, table, seq_alpha)
        seq_lp = length_penalty(seq_lengths, seq_alpha)
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

    def result(self, lam: float, gamma: float, alphas: tuple[float, float], metric: Metric) -> SplitResult:
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
        return SplitResult(summary, *self._tables(lam, lm, alphas, chosen, baseline))

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
