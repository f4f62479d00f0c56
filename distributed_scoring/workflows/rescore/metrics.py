"""Corpus WER and BLEU from per-hypothesis sufficient statistics (as jiwer and sacrebleu define them).

Each hypothesis's counts are computed once (word edits and reference words; BLEU's n-gram matches,
totals and lengths); any selection of hypotheses then gets its corpus figure from the summed counts,
which makes a grid search over weights a few vectorised sums instead of a metric call per grid point.
"""

from __future__ import annotations

from importlib import metadata

import numpy as np

from ...errors import UserError


class WerStats:
    """Statistics per hypothesis: [word edits, reference words], with jiwer's words and jiwer's edit count.

    jiwer's corpus WER is (S + D + I) / reference words, and S + D + I of an alignment of least cost is
    the word-level Levenshtein distance. `jiwer.process_words` builds every alignment as Python objects
    (10 s per 10^5 hypotheses); rapidfuzz's `cpdist` computes the distances alone, in C, on the words
    jiwer's own default transform makes (tests/workflows compare both on random lists).
    """

    name = "wer"
    higher_is_better = False
    scale = "fraction (jiwer's corpus WER: total edits / total reference words)"

    def statistics(self, refs: list[str], hyps: list[str]) -> np.ndarray:
        from jiwer.transformations import wer_default
        from rapidfuzz.distance import Levenshtein
        from rapidfuzz.process import cpdist

        stats = np.zeros((len(hyps), 2), dtype=np.int64)  # (H, 2)
        if hyps:
            ref_words, hyp_words = wer_default(refs), wer_default(hyps)
            stats[:, 0] = cpdist(ref_words, hyp_words, scorer=Levenshtein.distance, dtype=np.int64)
            stats[:, 1] = [len(words) for words in ref_words]
        return stats

    def corpus(self, totals: np.ndarray) -> float:
        if totals[1] == 0:
            raise UserError("every reference is empty, so WER is undefined; check the references")
        return float(totals[0] / totals[1])

    def sentence(self, stats: np.ndarray) -> np.ndarray:
        """(H,) higher is better: minus the word edits."""
        return -stats[:, 0].astype(np.float64)

    def signature(self) -> str:
        return f"jiwer {metadata.version('jiwer')}, default word transform (whitespace split)"


class BleuStats:
    """Statistics per hypothesis: [hyp length, ref length, matches 1..4, n-grams 1..4], sacrebleu's order."""

    name = "bleu"
    higher_is_better = True
    scale = "sacrebleu corpus BLEU, 0-100"

    def __init__(self, tokenize: str, lowercase: bool) -> None:
        from sacrebleu.metrics import BLEU

        # effective_order only changes sentence scores; the counts are what is kept.
        self.bleu = BLEU(tokenize=tokenize, lowercase=lowercase, effective_order=True)
        self.corpus_bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
        self.corpus_bleu.num_refs = 1  # one reference per utterance; sacrebleu notes it for the signature
        self.order = self.bleu.max_ngram_order

    def statistics(self, refs: list[str], hyps: list[str]) -> np.ndarray:
        out = np.zeros((len(hyps), 2 + 2 * self.order), dtype=np.int64)  # (H, K)
        for row, (ref, hyp) in enumerate(zip(refs, hyps)):
            s = self.bleu.sentence_score(hyp, [ref])
            out[row] = [s.sys_len, s.ref_len, *s.counts, *s.totals]
        return out

    def corpus(self, totals: np.ndarray) -> float:
        return self._score(totals, effective_order=False)

    def sentence(self, stats: np.ndarray) -> np.ndarray:
        """(H,) smoothed sentence BLEU (exp smoothing, effective order, as sacrebleu's sentence_bleu)."""
        return np.array([self._score(row, effective_order=True) for row in stats])

    def _score(self, stats: np.ndarray, effective_order: bool) -> float:
        from sacrebleu.metrics import BLEU

        n = self.order
        return BLEU.compute_bleu(
            correct=[int(v) for v in stats[2 : 2 + n]],
            total=[int(v) for v in stats[2 + n :]],
            sys_len=int(stats[0]),
            ref_len=int(stats[1]),
            smooth_method=self.corpus_bleu.smooth_method,
            smooth_value=self.corpus_bleu.smooth_value,
            effective_order=effective_order,
            max_ngram_order=n,
        ).score

    def signature(self) -> str:
        return str(self.corpus_bleu.get_signature())


Metric = WerStats | BleuStats


def metric_for(name: str, bleu_tokenize: str = "13a", bleu_lowercase: bool = False) -> Metric:
    """`wer` (ASR, lower is better) or `bleu` (MT, higher is better)."""
    return WerStats() if name == "wer" else BleuStats(bleu_tokenize, bleu_lowercase)
