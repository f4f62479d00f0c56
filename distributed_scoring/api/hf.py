"""Hugging Face `datasets` in and out: a dataset comes back with the scores as added columns.

    >>> from datasets import Dataset
    >>> scored = scorer.score_dataset(Dataset.from_dict({"text": ["the quick brown fox", ""]}))
    >>> scored.column_names[:4], scored[1]["status"], scored[1]["error"]
    (['text', 'pll', 'n_tokens', 'n_words'], 'error', 'empty or whitespace-only text')

It is `Dataset.map` in batches, reading only the text column, with the added columns' features given
up front (so a batch where every row failed keeps their types). The model stays in this process, so
there is no `num_proc`: parallel scoring of a large corpus is `dscore score --ray` or `PLLStage`. The
map is fingerprinted from the input's fingerprint, the scorer's signature and the options (hashing the
model itself would take long), and never loaded from the cache: a local model folder may change under
the same name, so the scores are always computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UserError
from .rows import added_schema
from .scorer import CHUNK_ROWS, MLMScorer

if TYPE_CHECKING:
    from datasets import Dataset


def score_dataset(
    scorer: MLMScorer,
    dataset: Dataset,
    text_column: str = "text",
    per_token: bool = False,
    word_scores: bool = False,
    prefix: str = "",
    batch_size: int = CHUNK_ROWS,
) -> Dataset:
    """`dataset` (a `Dataset`, each split of a `DatasetDict`, or an `IterableDataset`, lazily) with the
    columns of `added_schema` after its own, rows in the same order; see `MLMScorer.score`."""
    from datasets import DatasetDict, Features, IterableDataset, IterableDatasetDict
    from datasets.fingerprint import Hasher

    if isinstance(dataset, (DatasetDict, IterableDatasetDict)):
        return type(dataset)(
            {
                split: score_dataset(scorer, part, text_column, per_token, word_scores, prefix, batch_size)
                for split, part in dataset.items()
            }
        )
    added = added_schema(per_token, word_scores, prefix)
    columns = dataset.column_names
    if columns is not None:  # an IterableDataset may not know its columns before it is read
        if text_column not in columns:
            raise UserError(
                f"the dataset has no text column {text_column!r}; its columns are {columns}: pass text_column="
            )
        clash = [name for name in added.names if name in columns]
        if clash:
            raise UserError(f"the dataset already has columns {clash}: pass prefix= (prefix='mlm_' adds mlm_pll, ...)")
    new = Features.from_arrow_schema(added)
    features = Features({**dataset.features, **new}) if dataset.features is not None else None

    def add(texts: list) -> dict:
        return scorer.score_table(texts, per_token, word_scores, prefix).to_pydict()

    options = dict(batched=True, batch_size=batch_size, input_columns=[text_column], features=features)
    if isinstance(dataset, IterableDataset):
        return dataset.map(add, **options)
    fingerprint = Hasher.hash([dataset._fingerprint, scorer.signature, text_column, per_token, word_scores, prefix])
    return dataset.map(add, new_fingerprint=fingerprint, load_from_cache_file=False, desc="scoring", **options)
