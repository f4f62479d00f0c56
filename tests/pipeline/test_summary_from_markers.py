"""summary.json from the shards' markers (`io.output.row_sums`, recorded as each shard is written) against the
naive reference: every row read back and summed once (`CorpusStats.of_table`); and a folder whose markers record
no figures (an earlier dscore's) summarised from its rows, to the same figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RunConfig
from distributed_scoring.io import schema as S
from distributed_scoring.io.output import FILE_MD5, ROW_SUMS, unknown_tokens
from distributed_scoring.pipeline.stats import CorpusStats
from distributed_scoring.workflows.score import score

from helpers import tiny


@pytest.fixture
def config(tmp_path, tiny_model_dir) -> RunConfig:
    """Two inputs, partitioned by a column (a row without one), an empty text (an error row), shards of mixed
    partitions."""
    jsonl = tmp_path / "p.jsonl"
    sources = ["news", "web", None]
    jsonl.write_text(
        "".join(
            json.dumps({"text": text, **({"source": sources[i % 3]} if sources[i % 3] else {})}) + "\n"
            for i, text in enumerate([*tiny.CORPUS[:7], ""])
        )
    )
    other = tmp_path / "q.jsonl"
    other.write_text("".join(json.dumps({"text": t, "source": "web"}) + "\n" for t in tiny.CORPUS[7:12]))
    return RunConfig(
        InputSpec((str(jsonl), str(other)), shard_rows=3, partition_column="source"),
        ModelSpec(str(tiny_model_dir("bert"))),
        output=str(tmp_path / "out"),
    )


def reference(table) -> dict:
    """The figures of `table`'s rows summed once, as summary.json states them per input and per partition."""
    return CorpusStats.of_table(table).to_dict()


def close(found: dict, expected: dict) -> None:
    for name, value in expected.items():
        if isinstance(value, float):
            assert math.isclose(found[name], value, rel_tol=1e-12), name
        else:
            assert found[name] == value, name


def test_the_summary_from_the_markers_is_that_of_every_row_read_back(config):
    summary = score(config)
    out = Path(config.output)
    markers = [json.loads(p.read_text()) for p in sorted((out / "_done").glob("*.json"))]
    assert all(ROW_SUMS in m for m in markers) and len(markers) == 5
    table = pq.read_table(out / "rows")
    assert table.num_rows == summary["rows"] == 13 and summary["errors"] == 1
    unknown, mostly = unknown_tokens(table)
    close(summary, {**reference(table), "n_unknown": unknown, "mostly_unknown_rows": mostly})
    for name, figures in summary["by_input"].items():
        close(figures, reference(table.filter(pc.starts_with(table[S.ID], f"{name}:"))))
    assert set(summary["by_partition"]) == {"news", "web", "None"}
    for name, figures in summary["by_partition"].items():
        mask = pc.is_null(table[S.PARTITION]) if name == "None" else pc.equal(table[S.PARTITION], name)
        close(figures, reference(table.filter(mask)))


def test_markers_without_figures_are_summarised_from_their_rows(config):
    """A folder an earlier dscore wrote: its markers record no figures (nor the file's MD5); the rerun reads the
    shards' rows and states the same summary."""
    summary = score(config)
    out = Path(config.output)
    for path in (out / "_done").glob("*.json"):
        marker = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in marker.items() if k not in (ROW_SUMS, FILE_MD5)}))
    (out / "summary.json").unlink()
    assert score(config) == summary
