"""The Stage base: a stage's input columns are checked on entry, its output rows are built into its
declared schema and checked, and the workload stages declare columns that the stage before them makes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.model_files import load_tokenizer
from distributed_scoring.io import schema as S
from distributed_scoring.pipeline.stage import ColumnError, Row, Stage
from distributed_scoring.workloads.causal import CausalScorer
from distributed_scoring.workloads.joints import EXAMPLES_SCHEMA, A, B, JointsScorer, PairPreparer
from distributed_scoring.workloads.pll import PLLScorer
from distributed_scoring.workloads.prepare import PLLPreparer

SHOUTED = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("shout", pa.string(), nullable=False)])


class Shout(Stage):
    reads = {"id": "the row's id", "text": "what to shout"}
    writes = SHOUTED

    def process(self, rows: list[Row]) -> list[Row]:
        return [{**row, "shout": row["text"].upper()} for row in rows]


class Forgetful(Shout):
    def process(self, rows: list[Row]) -> list[Row]:
        return [{"id": row["id"]} for row in rows]


class Silent(Shout):
    def process(self, rows: list[Row]) -> list[Row]:
        return [{"id": row["id"], "shout": None} for row in rows]


class Tagged(Shout):
    """An output schema that depends on the input: `tag` passes through when present."""

    def output_schema(self, columns):
        return pa.schema([*SHOUTED, pa.field("tag", pa.string())]) if "tag" in columns else SHOUTED


def read_rows(texts: list[str | None], partition: bool = False) -> pa.Table:
    rows = [
        {
            S.ID: f"r{i}",
            S.TEXT: t,
            S.STATUS: S.STATUS_OK if t is not None else S.STATUS_ERROR,
            S.ERROR: None if t is not None else "no text",
            **({S.PARTITION: "p"} if partition else {}),
        }
        for i, t in enumerate(texts)
    ]
    return pa.Table.from_pylist(rows, schema=S.read_schema(partition))


def test_a_table_without_a_declared_column_names_the_stage_the_column_and_the_columns_found():
    with pytest.raises(ColumnError) as error:
        Shout()(pa.table({"id": ["a"], "txt": ["hi"]}))
    message = str(error.value)
    assert "Shout" in message
    assert "'text': what to shout" in message
    assert "['id', 'txt']" in message
    assert "'id':" not in message  # only the missing column is listed as missing


def test_the_output_has_the_declared_schema_and_drops_keys_outside_it():
    out = Shout()(pa.table({"id": ["a", "b"], "text": ["hi", "yo"], "extra": [1, 2]}))
    assert out.schema == SHOUTED
    assert out.to_pylist() == [{"id": "a", "shout": "HI"}, {"id": "b", "shout": "YO"}]


def test_an_empty_table_gives_an_empty_table_of_the_declared_schema():
    out = Shout()(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}))
    assert out.num_rows == 0 and out.schema == SHOUTED


def test_a_row_without_an_output_column_is_refused_rather_than_written_as_null():
    with pytest.raises(ColumnError, match=r"Forgetful made a row without the columns \['shout'\]"):
        Forgetful()(pa.table({"id": ["a"], "text": ["hi"]}))


def test_a_null_in_a_not_null_output_column_is_refused():
    with pytest.raises(ColumnError, match=r"Silent made nulls in its not-null columns \['shout'\]"):
        Silent()(pa.table({"id": ["a"], "text": ["hi"]}))


def test_an_output_schema_can_follow_the_input_columns():
    tagged = Tagged()(pa.table({"id": ["a"], "text": ["hi"], "tag": ["t"]}))
    assert tagged.to_pylist() == [{"id": "a", "shout": "HI", "tag": "t"}]
    assert Tagged()(pa.table({"id": ["a"], "text": ["hi"]})).schema == SHOUTED


def test_a_stage_without_an_output_schema_says_so():
    class Undeclared(Stage):
        reads = {}

        def process(self, rows):
            return rows

    with pytest.raises(NotImplementedError, match="Undeclared declares neither"):
        Undeclared()(pa.table({"id": ["a"]}))


@pytest.fixture(scope="module")
def preparer(tiny_model_dir) -> PLLPreparer:
    return PLLPreparer(*load_tokenizer(ModelSpec(str(tiny_model_dir("bert")))))


def test_the_preparer_declares_the_read_columns_and_refuses_a_table_without_them(preparer):
    assert set(PLLPreparer.reads) == {S.ID, S.TEXT, S.STATUS, S.ERROR}
    assert all(PLLPreparer.reads.values())
    with pytest.raises(
        ColumnError, match=r"stage PLLPreparer reads .*'status'.*'error'.*the table has \['id', 'text'\]"
    ):
        preparer(pa.table({S.ID: ["a"], S.TEXT: ["the fox"]}))


@pytest.mark.parametrize("partition", [False, True])
def test_the_preparer_writes_the_prepared_schema_and_keeps_error_rows(preparer, partition):
    out = preparer(read_rows(["the quick fox", None, "  "], partition))
    assert out.schema == S.prepared_schema(partition)
    rows = out.to_pylist()
    assert [r[S.STATUS] for r in rows] == [S.STATUS_OK, S.STATUS_ERROR, S.STATUS_ERROR]
    assert rows[1][S.ERROR] == "no text" and rows[2][S.ERROR] == "empty or whitespace-only text"
    assert rows[0][S.INPUT_IDS] and rows[0][S.TARGETS] and rows[0][S.N_WORDS] == 3
    assert all(r[S.PARTITION] == "p" for r in rows) if partition else S.PARTITION not in out.column_names


def test_each_stage_reads_only_columns_that_the_stage_before_it_writes(preparer, tiny_model_dir, tmp_path):
    """read -> PLLPreparer -> PLLScorer, read -> CausalScorer, read -> PairPreparer -> JointsScorer."""
    read = S.read_schema().names
    prepared = preparer.output_schema(read).names
    examples = tmp_path / "examples.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{S.ID: "r0", S.TEXT: "the quick fox", A: None, B: None, S.ERROR: None}], schema=EXAMPLES_SCHEMA
        ),
        examples,
    )
    pairs = PairPreparer(ModelSpec(str(tiny_model_dir("bert"))), str(examples), "random", 0)
    paired = pairs(read_rows(["the quick fox"]))
    assert paired.column_names == pairs.output_schema(read).names
    for stage, given in (
        (PLLPreparer, read),
        (CausalScorer, read),
        (PLLScorer, prepared),
        (PairPreparer, read),
        (JointsScorer, paired.column_names),
    ):
        assert issubclass(stage, Stage)
        assert set(stage.reads) <= set(given), stage.__name__
        assert all(isinstance(d, str) and d for d in stage.reads.values()), stage.__name__
