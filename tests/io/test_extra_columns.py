"""Extra columns (infilling's answers) travel with the read rows from every record format, null where absent."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from distributed_scoring.config import InputSpec
from distributed_scoring.io.sources import plan_shards, read_unit, read_units


def read(path, extra=("answer",)) -> list[dict]:
    spec = InputSpec((str(path),), extra_columns=extra)
    return [r for unit in read_units(plan_shards(spec)) for _, rows in read_unit(unit, spec) for r in rows.to_pylist()]


def test_jsonl_csv_and_parquet_carry_extra_columns_as_strings(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps({"text": "x", "answer": ["A", "C"]}) + "\n" + json.dumps({"text": "y"}) + "\n")
    assert [r["answer"] for r in read(jsonl)] == ["A C", None]
    csv = tmp_path / "a.csv"
    csv.write_text("text,answer\nx,the fox\n")
    assert read(csv)[0]["answer"] == "the fox"
    parquet = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["x"], "answer": [7]}), parquet)
    assert read(parquet)[0]["answer"] == "7"


def test_a_file_without_the_column_reads_nulls_and_text_files_too(tmp_path):
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": ["x", "y"]}), parquet)
    assert [r["answer"] for r in read(parquet)] == [None, None]
    text = tmp_path / "b.txt"
    text.write_text("x\n")
    assert read(text)[0]["answer"] is None
    assert "answer" not in read(text, extra=())[0]
