"""`PLLStage` on every batch format, called directly and in Ray Data pipelines on the user's own columns."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from distributed_scoring import MLMScorer, PLLStage
from distributed_scoring.api.scorer import added_schema
from distributed_scoring.pipeline.stage import ColumnError

from helpers.pll import TEXTS

SENTENCES = TEXTS[:5] + ["", None, "the " * 200]
OK = [True] * 5 + [False] * 2 + [True]  # the long text is scored in windows (`long_texts="window"`)


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return str(tiny_model_dir("bert"))


@pytest.fixture(scope="module")
def expected(bert):
    return MLMScorer(bert, device="cpu").pll(SENTENCES)


def check(rows: list[dict], expected: list[float], text_column: str = "sentence", prefix: str = "") -> None:
    """The rows keep their own columns and order and carry the scores of their texts."""
    assert [r[text_column] for r in rows] == SENTENCES
    for row, ok, pll in zip(rows, OK, expected):
        assert row[prefix + "status"] == ("ok" if ok else "error")
        if ok:  # each term within 1e-5 of the in-process batching's, the sum within 1e-5 a term
            tolerance = 1e-5 * max(1, row[prefix + "n_tokens"])
            assert row[prefix + "pll"] == pytest.approx(pll, abs=tolerance) and row[prefix + "error"] is None
        else:
            assert row[prefix + "pll"] is None or math.isnan(row[prefix + "pll"])
            assert row[prefix + "error"] and row[prefix + "n_tokens"] == 0


def test_each_batch_format_comes_back_with_its_columns_and_typed_scores(bert, expected):
    stage = PLLStage(bert, text_column="sentence", per_token=True, device="cpu")
    table = pa.table({"key": list(range(len(SENTENCES))), "sentence": SENTENCES})
    added = added_schema(per_token=True)

    out = stage(table)
    assert isinstance(out, pa.Table) and out.schema == pa.schema([*table.schema, *added])
    check(out.to_pylist(), expected)

    frame = table.to_pandas().set_axis(range(10, 10 + len(SENTENCES)))  # an index that is not 0..n-1
    out = stage(frame)
    assert isinstance(out, pd.DataFrame) and list(out.index) == list(frame.index)
    assert pa.Table.from_pandas(out, preserve_index=False).schema.field("error").type == pa.string()
    check(pa.Table.from_pandas(out, preserve_index=False).to_pylist(), expected)
    strings = frame.astype({"sentence": "string"})  # pandas' own missing value, NA
    assert stage(strings)["status"].tolist() == ["ok" if ok else "error" for ok in OK]
    assert stage(strings)["error"].iloc[6] == "text is missing (null)"

    numpy = {"key": np.arange(len(SENTENCES)), "sentence": np.array(SENTENCES, dtype=object)}
    out = stage(numpy)
    assert isinstance(out, pa.Table) and out.column_names == ["key", "sentence", *added.names]
    check(out.to_pylist(), expected)


def test_a_batch_where_every_row_fails_keeps_the_column_types(bert):
    out = PLLStage(bert, device="cpu")(pa.table({"text": ["", None]}))
    assert out.schema == pa.schema([pa.field("text", pa.string()), *added_schema()])
    assert out["status"].to_pylist() == ["error", "error"]


def test_miswired_batches_say_what_to_pass(bert):
    stage = PLLStage(bert, device="cpu")
    with pytest.raises(ColumnError, match="text column 'text'.*'sentence'.*text_column="):
        stage(pa.table({"sentence": ["a"]}))
    with pytest.raises(ColumnError, match=r"\['status'\].*prefix="):
        stage(pa.table({"text": ["a"], "status": ["x"]}))
    out = PLLStage(bert, prefix="mlm_", device="cpu")(pa.table({"text": ["the fox"], "status": ["x"]}))
    assert out["status"].to_pylist() == ["x"] and out["mlm_status"].to_pylist() == ["ok"]


@pytest.mark.ray
@pytest.mark.parametrize("batch_format", ["numpy", "pandas", "pyarrow"])
def test_in_a_ray_data_pipeline_on_the_users_columns(ray_local, tmp_path, bert, expected, batch_format):
    import pyarrow.parquet as pq
    import ray

    pq.write_table(pa.table({"key": list(range(len(SENTENCES))), "sentence": SENTENCES}), tmp_path / "in.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "in.parquet"))
    ds = ds.map_batches(
        PLLStage,
        fn_constructor_kwargs={"model": bert, "text_column": "sentence", "prefix": "mlm_", "device": "cpu"},
        compute=ray.data.ActorPoolStrategy(size=1),
        batch_size=3,
        batch_format=batch_format,
    )
    ds.write_parquet(str(tmp_path / "out"))
    rows = sorted(pq.read_table(tmp_path / "out").to_pylist(), key=lambda r: r["key"])
    check(rows, expected, prefix="mlm_")


@pytest.mark.ray
def test_plain_text_rows(ray_local, tmp_path, bert, expected):
    import ray

    lines = [s for s, ok in zip(SENTENCES, OK) if ok]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    ds = ray.data.read_text(str(tmp_path / "corpus.txt"))
    rows = ds.map_batches(
        PLLStage, fn_constructor_kwargs={"model": bert, "device": "cpu"}, compute=ray.data.ActorPoolStrategy(size=1)
    ).take_all()
    assert [r["text"] for r in rows] == lines and {r["status"] for r in rows} == {"ok"}
    for row, pll in zip(rows, [p for p, ok in zip(expected, OK) if ok]):  # the long text's terms add up
        assert row["pll"] == pytest.approx(pll, abs=1e-5 * max(1, row["n_tokens"]))
