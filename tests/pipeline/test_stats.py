"""Corpus statistics add up per shard and give corpus-level (not averaged) pseudo-perplexity."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from distributed_scoring.io import schema as S
from distributed_scoring.measures import pppl
from distributed_scoring.pipeline.stats import CorpusStats


def table(rows):
    return pa.Table.from_pylist([{S.STATUS: s, S.PLL: p, S.N_TOKENS: n, S.N_WORDS: w} for s, p, n, w in rows])


def test_pppl_is_corpus_level():
    a = CorpusStats.of_table(table([("ok", -10.0, 5, 2), ("error", None, 0, 0)]))
    b = CorpusStats.of_table(table([("ok", -40.0, 5, 4)]))
    total = a + b
    assert (total.rows, total.ok, total.errors) == (3, 2, 1)
    assert total.pppl_token == pytest.approx(math.exp(50 / 10))
    assert total.pppl_word == pytest.approx(math.exp(50 / 6))
    mean_of_sentences = (math.exp(10 / 5) + math.exp(40 / 5)) / 2
    assert total.pppl_token != pytest.approx(mean_of_sentences)


def test_empty_counts_give_no_pppl():
    assert pppl(0.0, 0) is None
    assert CorpusStats().pppl_token is None
