"""`MLMScorer.score_dataset`: Hugging Face datasets in, the same datasets with score columns out."""

from __future__ import annotations

import pyarrow as pa
import pytest
from datasets import Dataset, DatasetDict, IterableDataset

from distributed_scoring import MLMScorer, UserError
from distributed_scoring.api.scorer import added_schema

from helpers.pll import TEXTS, assert_same

SENTENCES = TEXTS[:4] + ["", "the " * 200]


@pytest.fixture(scope="module")
def scorer(tiny_model_dir):
    return MLMScorer(str(tiny_model_dir("bert")), device="cpu")


def test_a_dataset_comes_back_with_typed_score_columns(scorer):
    ds = Dataset.from_dict({"key": list(range(len(SENTENCES))), "sentence": SENTENCES})
    scored = scorer.score_dataset(
        ds, text_column="sentence", word_scores=True, batch_size=2
    )  # the last batch all errors
    added = added_schema(word_scores=True)
    assert scored.column_names == ["key", "sentence", *added.names]
    assert scored.data.table.select(added.names).schema.types == added.types
    assert list(scored["key"]) == list(ds["key"]) and list(scored["sentence"]) == SENTENCES
    rows = scorer.score(SENTENCES, word_scores=True)
    for got, want in zip(scored, rows):
        assert_same({k: got[k] for k in added.names}, {k: want[k] for k in added.names})
    again = scorer.score_dataset(ds, text_column="sentence", word_scores=True, batch_size=2)
    assert again._fingerprint == scored._fingerprint and list(again["pll"]) == list(scored["pll"])


def test_dataset_dicts_and_iterable_datasets(scorer):
    splits = DatasetDict(
        {"train": Dataset.from_dict({"text": SENTENCES[:3]}), "test": Dataset.from_dict({"text": SENTENCES[3:]})}
    )
    scored = scorer.score_dataset(splits, prefix="mlm_")
    expected = [r["pll"] for r in scorer.score(SENTENCES)]
    assert list(scored["train"]["mlm_pll"]) + list(scored["test"]["mlm_pll"]) == pytest.approx(expected, abs=1e-5)

    def rows():
        yield from ({"text": t} for t in SENTENCES)

    streamed = scorer.score_dataset(IterableDataset.from_generator(rows), batch_size=4)
    assert [r["status"] for r in streamed] == ["ok"] * 4 + ["error", "ok"]
    assert [r["windowed"] for r in streamed] == [False] * 5 + [True]  # "the " * 200: longer than the window


def test_wrong_columns_are_refused_before_work(scorer):
    ds = Dataset.from_dict({"sentence": ["the fox"], "pll": [1.0]})
    with pytest.raises(UserError, match="no text column 'text'.*'sentence'"):
        scorer.score_dataset(ds)
    with pytest.raises(UserError, match=r"\['pll'\].*prefix="):
        scorer.score_dataset(ds, text_column="sentence")
    assert isinstance(scorer.score_dataset(ds, text_column="sentence", prefix="x_").data.table, pa.Table)
