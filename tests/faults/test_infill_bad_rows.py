"""Infilling a shard whose ids repeat, beside a null text and a row without a mask token.

The score stage used to join its fills back to the rows by id: an error row that shared its id with a
filled row was handed that row's fills and crashed the shard with a TypeError (every rerun again), and two
fillable rows with one id both got the second one's fills. Fills are joined by the row's place in the
shard now, so each bad row is an error row and each good row gets its own fills.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.io import schema as S
from distributed_scoring.workloads.infill import InfillOptions, InfillPreparer, InfillScorer

ROWS = [  # (id, text): ids repeat on purpose
    ("a", "the [MASK] fox"),
    ("a", None),
    ("b", "the [MASK] over the lazy dog"),
    ("b", "no mask token here"),
    ("c", "she sells [MASK] by the seashore"),
    ("c", "the quick [MASK] jumps"),
]


def read_table(rows: list[tuple[str, str | None]]) -> pa.Table:
    """Rows as the read stage gives them: a null text is already an error row."""
    return pa.Table.from_pylist(
        [
            {
                S.ID: i,
                S.TEXT: t,
                S.STATUS: "ok" if t is not None else "error",
                S.ERROR: None if t is not None else "text is missing (null)",
            }
            for i, t in rows
        ],
        schema=S.read_schema(extra=("answer",)),
    )


def test_repeated_ids_with_bad_rows_give_error_rows_and_each_good_row_its_own_fills(tiny_model_dir):
    model = ModelSpec(str(tiny_model_dir("bert")))
    options = InfillOptions(beam=2)
    scored = InfillScorer(model, options)(InfillPreparer(model, options)(read_table(ROWS))).to_pylist()
    assert [(r["id"], r["status"]) for r in scored] == [
        ("a", "ok"),
        ("a", "error"),
        ("b", "ok"),
        ("b", "error"),
        ("c", "ok"),
        ("c", "ok"),
    ]
    assert scored[1]["error"] == "text is missing (null)" and "no mask token" in scored[3]["error"]
    assert all(r["beams"] is None and r["n_masks"] == 0 for r in scored if r["status"] == "error")
    # Each filled row's fills are its own: its text with the masks replaced, as filled alone.
    for row, (_, text) in zip(scored, ROWS):
        if row["status"] == "ok":
            prefix, suffix = text.split("[MASK]")
            assert row["best"].startswith(prefix) and row["best"].endswith(suffix)
    alone = InfillScorer(model, options)(InfillPreparer(model, options)(read_table([ROWS[5]]))).to_pylist()
    assert [b["tokens"] for b in alone[0]["beams"]] == [b["tokens"] for b in scored[5]["beams"]]
    assert [b["score"] for b in alone[0]["beams"]] == pytest.approx([b["score"] for b in scored[5]["beams"]], abs=1e-5)
