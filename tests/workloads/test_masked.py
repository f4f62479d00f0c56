"""The one prepare stage of texts with mask tokens, as infill, generate and sample use it: positions and
their character spans, rows passed through or refused the same way by all three."""

from __future__ import annotations

import pyarrow as pa
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.io import schema as S
from distributed_scoring.workloads.generate import GenerateOptions, GeneratePreparer
from distributed_scoring.workloads.infill import InfillOptions, InfillPreparer
from distributed_scoring.workloads.sample import SampleOptions, SamplePreparer

PREPARERS = {
    "infill": (InfillPreparer, InfillOptions()),
    "generate": (GeneratePreparer, GenerateOptions()),
    "sample": (SamplePreparer, SampleOptions()),
}


def rows(*texts: str, status: str = S.STATUS_OK, error: str | None = None) -> pa.Table:
    return pa.table(
        {
            S.ID: [f"r{i}" for i in range(len(texts))],
            S.TEXT: list(texts),
            S.STATUS: [status] * len(texts),
            S.ERROR: [error] * len(texts),
        }
    )


@pytest.fixture(scope="module", params=sorted(PREPARERS))
def preparer(request, tiny_model_dir):
    stage, options = PREPARERS[request.param]
    return stage(ModelSpec(str(tiny_model_dir("bert"))), options)


def test_the_positions_are_the_masks_and_their_spans_point_at_them(preparer):
    text = "the quick [MASK] fox [MASK] over the lazy dog"
    row = preparer(rows(text)).to_pylist()[0]
    positions = row[preparer.positions]
    assert row[S.STATUS] == S.STATUS_OK and len(positions) == 2
    assert [row[S.INPUT_IDS][p] for p in positions] == [preparer.tokenizer.mask_token_id] * 2
    assert [text[start:end] for start, end in row["spans"]] == ["[MASK]", "[MASK]"]


def test_an_unreadable_row_passes_through_with_nothing_prepared(preparer):
    row = preparer(rows("x [MASK] y", status=S.STATUS_ERROR, error="unreadable")).to_pylist()[0]
    assert (row[S.STATUS], row[S.ERROR], row[S.TEXT]) == (S.STATUS_ERROR, "unreadable", "x [MASK] y")
    assert row[S.INPUT_IDS] is None and row[preparer.positions] is None and row["spans"] is None


def test_a_text_over_the_model_length_is_an_error_row(preparer):
    text = " ".join(["the"] * (preparer.max_length + 5) + ["[MASK]"])
    row = preparer(rows(text)).to_pylist()[0]
    assert row[S.STATUS] == S.STATUS_ERROR
    assert row[S.ERROR].startswith("text is ") and f"over the model's maximum of {preparer.max_length}" in row[S.ERROR]
    assert row[S.INPUT_IDS] is None and row[preparer.positions] is None
