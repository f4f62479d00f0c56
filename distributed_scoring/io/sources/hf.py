"""Hugging Face `datasets` folders (`save_to_disk`) as input, read by row index."""

from __future__ import annotations

from typing import Iterator

from ...config import InputSpec
from ..inputs import InputFile
from ..storage import filesystem
from .base import Shard, named_columns, require_columns, row_shards, table_rows


def _hf_dataset(f: InputFile):
    from datasets import load_from_disk

    _, path = filesystem(f.path)
    return load_from_disk(path)


def hf_plan(f: InputFile, spec: InputSpec) -> list[Shard]:
    dataset = _hf_dataset(f)
    require_columns(f, spec, dataset.column_names)
    n_rows = len(dataset)
    return row_shards(f, n_rows, spec.shard_rows)


def hf_rows(shard: Shard, spec: InputSpec) -> Iterator[dict]:
    dataset = _hf_dataset(shard.file)
    columns = named_columns(spec) + [c for c in spec.extra_columns if c in dataset.column_names]
    dataset = dataset.select_columns(columns).with_format("arrow")
    yield from table_rows(dataset[shard.start : shard.start + shard.rows], shard, spec)
