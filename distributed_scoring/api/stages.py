"""`PLLStage`: PLL scoring as a Ray Data stage for the user's own pipeline, on the user's own columns.

    ds = ray.data.read_parquet("s3://bucket/corpus/")
    ds = ds.map_batches(PLLStage, fn_constructor_kwargs={"model": "bert-base-cased", "text_column": "sentence"},
                        **PLLStage.actor_pool(), batch_size=1024)
    ds.write_parquet("s3://bucket/scored/")

`PLLStage.actor_pool()` sizes the pool from the cluster (an actor per GPU, else CPU actors that leave a
CPU to the pipeline's other tasks) and refuses a size that could never start (`api.pool`).

Each actor loads the model once (an `MLMScorer`); each batch comes back with every input column and
the columns of `scorer.added_schema` (pll, n_tokens, n_words, n_unknown, pppl_token, pppl_word,
status, error; tokens and token_logprobs with `per_token`, word_scores with `word_scores`), rows in
the same order. A row that cannot be scored (empty, too long, a null or non-string text) becomes an
error row; a batch fails only for what concerns every row: a missing text column, a name clash with
the added columns (pass `prefix`), or a device that fails on every row (Ray then retries the batch).

Batches of any `batch_format` are taken. The added columns keep their Arrow types in every batch, even
one where every row failed (an all-null column would otherwise come out untyped, and Ray could not
write blocks of both kinds into one file): a `pyarrow` batch comes back as a pyarrow Table, a `pandas`
batch as a DataFrame whose added columns have Arrow dtypes, and a `numpy` batch (Ray's default) as a
pyarrow Table, since NumPy has no typed null. It also works without Ray, on a Table or a DataFrame:

    >>> import pyarrow as pa
    >>> stage = PLLStage(model, text_column="sentence", device="cpu")
    >>> out = stage(pa.table({"key": [1, 2], "sentence": ["the quick brown fox", ""]}))
    >>> out.column_names[:5], out["status"].to_pylist()
    (['key', 'sentence', 'pll', 'n_tokens', 'n_words'], ['ok', 'error'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ..io.schema import ERROR, STATUS
from ..io.schema import STATUS_ERROR as ERROR_STATUS
from ..pipeline.stage import ColumnError
from .pool import actor_pool
from .rows import added_schema
from .scorer import MLMScorer

# The columns `VariantsStage` adds, as `MLMScorer.variants` names them.
VARIANT_FIELDS = (
    pa.field("score", pa.float64()),
    pa.field("n_mutations", pa.int32()),
    pa.field(STATUS, pa.string()),
    pa.field(ERROR, pa.string()),
)


class PLLStage:
    """A callable class for `map_batches`: `model` and the other `MLMScorer` keyword arguments (device,
    dtype, variant, batch_tokens, revision, trust_remote_code, split_chars) choose the scorer;
    `text_column` names the batch's text column; `per_token` and `word_scores` add those columns;
    `prefix` is put before every added column's name (two models in one pipeline, or a batch that
    already has a `status` column)."""

    def __init__(
        self,
        model: str,
        text_column: str = "text",
        per_token: bool = False,
        word_scores: bool = False,
        prefix: str = "",
        **scorer_options: Any,
    ) -> None:
        self.scorer = MLMScorer(model, **scorer_options)
        self.text_column = text_column
        self.per_token, self.word_scores, self.prefix = per_token, word_scores, prefix

    def __call__(self, batch: Any) -> Any:
        columns = list(batch.column_names if isinstance(batch, pa.Table) else batch.keys())
        self._check(columns)
        added = self.scorer.score_table(_texts(batch, self.text_column), self.per_token, self.word_scores, self.prefix)
        return _with_columns(batch, added)

    @staticmethod
    def actor_pool(size: int | None = None, num_cpus: float | None = None, num_gpus: float | None = None) -> dict:
        """`map_batches`' `compute`, `num_cpus` and `num_gpus` for PLLStage actors this Ray cluster can start:
        left out, an actor per GPU (1 CPU each) on a cluster with GPUs, else as many 1-CPU actors as leave a
        CPU free for the pipeline's read and write tasks. A pool that could never start beside them (Ray Data
        would wait for it forever) raises `ActorPoolError`, saying what fits. See `api.pool.plan_pool`."""
        return actor_pool(size, num_cpus, num_gpus)

    def _check(self, columns: list[str]) -> None:
        if self.text_column not in columns:
            raise ColumnError(
                f"PLLStage reads the text column {self.text_column!r}, missing from the batch; the batch "
                f"has {columns}: pass text_column= in fn_constructor_kwargs"
            )
        names = self.scorer_columns()
        clash = [name for name in names if name in columns]
        if clash:
            raise ColumnError(
                f"PLLStage adds columns the batch already has ({clash}): pass prefix= in "
                "fn_constructor_kwargs (prefix='mlm_' adds mlm_pll, mlm_status, ...)"
            )

    def scorer_columns(self) -> list[str]:
        """The names of the columns this stage adds."""
        return added_schema(self.per_token, self.word_scores, self.prefix).names


class VariantsStage:
    """A callable class for `map_batches`: variant effects (`MLMScorer.variants`) of the batch's `mutant_column`
    (names such as A23G:K45R, positions numbered from `offset`) against the wild type of each row, one
    `target_seq` for every row or the row's `target_column`; adds `score`, `n_mutations`, `status`, `error`
    (after `prefix`). Each actor keeps the site tables of the wild types it has seen, so a wild type costs its
    masked passes once per actor, whatever the number of batches. A mutant named twice in a batch is scored once.

        >>> stage = VariantsStage(protein_model, target_seq="MKTAYIAKQRQISFVKSHFSRQ", device="cpu")
        >>> out = stage(pa.table({"mutant": ["K2R", "A4G", "K2R", "Z99A"]}))
        >>> out["n_mutations"].to_pylist(), out["status"].to_pylist()
        ([1, 1, 1, None], ['ok', 'ok', 'ok', 'error'])
    """

    def __init__(
        self,
        model: str,
        strategy: str = "masked-marginal",
        target_seq: str | None = None,
        target_column: str = "target_seq",
        mutant_column: str = "mutant",
        offset: int = 1,
        prefix: str = "",
        **scorer_options: Any,
    ) -> None:
        self.scorer = MLMScorer(model, **scorer_options)
        self.strategy, self.target_seq, self.offset, self.prefix = strategy, target_seq, offset, prefix
        self.target_column, self.mutant_column = target_column, mutant_column

    def __call__(self, batch: Any) -> Any:
        columns = list(batch.column_names if isinstance(batch, pa.Table) else batch.keys())
        needed = [self.mutant_column, *([] if self.target_seq else [self.target_column])]
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ColumnError(
                f"VariantsStage reads the column(s) {missing}, missing from the batch; the batch has {columns}: pass "
                "mutant_column= (and target_column=, or one target_seq=) in fn_constructor_kwargs"
            )
        clash = [c for c in self.scorer_columns() if c in columns]
        if clash:
            raise ColumnError(f"VariantsStage adds columns the batch already has ({clash}): pass prefix=")
        mutants = _texts(batch, self.mutant_column)
        targets = [self.target_seq] * len(mutants) if self.target_seq else _texts(batch, self.target_column)
        scored: dict[tuple[object, object], dict] = {}
        for target in dict.fromkeys(targets):
            names = list(dict.fromkeys(m for m, t in zip(mutants, targets) if t == target))
            if not isinstance(target, str) or not target.strip():
                rows = [{STATUS: ERROR_STATUS, ERROR: "the row has no wild-type sequence"} for _ in names]
            else:
                rows = self.scorer.variants(
                    [m if isinstance(m, str) else None for m in names], target, self.strategy, self.offset
                )
            scored.update({(target, m): r for m, r in zip(names, rows)})
        out = [scored[(t, m)] for m, t in zip(mutants, targets)]
        schema = pa.schema([f.with_name(self.prefix + f.name) for f in VARIANT_FIELDS])
        added = pa.table({f.name: [r.get(f.name.removeprefix(self.prefix)) for r in out] for f in schema}, schema)
        return _with_columns(batch, added)

    def scorer_columns(self) -> list[str]:
        """The names of the columns this stage adds."""
        return [self.prefix + f.name for f in VARIANT_FIELDS]


def _texts(batch: Any, column: str) -> list[object]:
    """The batch's text column as Python objects, a missing value (NaN, pandas' NA) as None."""
    if isinstance(batch, pa.Table):
        return batch.column(column).to_pylist()
    if isinstance(batch, Mapping):
        return [None if isinstance(v, float) and math.isnan(v) else v for v in batch[column].tolist()]
    values = batch[column]
    return values.astype(object).where(values.notna(), None).tolist()


def _with_columns(batch: Any, added: pa.Table) -> Any:
    """The batch with the added columns after its own, typed (see the module docstring)."""
    if isinstance(batch, Mapping):  # numpy: Ray's own conversion keeps tensor columns as tensors
        from ray.data.block import BlockAccessor

        batch = BlockAccessor.batch_to_block(dict(batch))
    if isinstance(batch, pa.Table):
        for field, column in zip(added.schema, added.columns):
            batch = batch.append_column(field, column)
        return batch
    import pandas as pd

    extra = added.to_pandas(types_mapper=pd.ArrowDtype).set_axis(batch.index)
    return pd.concat([batch, extra], axis=1)
