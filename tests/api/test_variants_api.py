"""Variant effects from Python: `MLMScorer.variants` against the naive float64 reference for every strategy, its
site tables kept between calls (a wild type's masked passes paid once), and `VariantsStage` on the batch kinds
Ray Data hands it."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from distributed_scoring import MLMScorer, VariantsStage
from distributed_scoring.errors import UserError
from distributed_scoring.pipeline.stage import ColumnError

from helpers.reference import NaiveVariants

WILD = "MKTAYIAKQRQISFVKSHFSRQ"
MUTANTS = ["K2R", "A4G:Q9E", "M1L:S13T:Q22F", "Q9K"]


@pytest.fixture(scope="module")
def protein(tiny_protein_dir):
    return str(tiny_protein_dir("bert"))


@pytest.fixture(scope="module")
def scorer(protein):
    return MLMScorer(protein, device="cpu", batch_tokens=100)


def sites(mutant: str) -> list[tuple[int, str, str]]:
    return [(int(p[1:-1]) - 1, p[0], p[-1]) for p in mutant.split(":")]


@pytest.mark.parametrize("strategy", ["wt-marginal", "masked-marginal", "mutant-marginal", "pll"])
def test_each_strategy_equals_the_naive_reference(scorer, strategy):
    rows = scorer.variants(MUTANTS, WILD, strategy)
    expected = NaiveVariants(scorer.mlm.model, scorer.mlm.tokenizer).scores(strategy, WILD, [sites(m) for m in MUTANTS])
    assert [r["mutant"] for r in rows] == MUTANTS
    assert [r["n_mutations"] for r in rows] == [1, 2, 3, 1]
    for row, want in zip(rows, expected):
        assert row["status"] == "ok" and abs(row["score"] - want) <= 1e-5 * max(1, abs(want)), (row, want)


def test_a_wild_type_table_is_computed_once(protein):
    scorer = MLMScorer(protein, device="cpu")
    first = scorer.variants(["K2R", "T3S"], WILD)
    assert scorer.site_passes == 2
    again = scorer.variants(["K2A", "T3S", "A4G"], WILD)  # positions 2 and 3 kept, 4 new
    assert scorer.site_passes == 3 and again[1]["score"] == first[1]["score"]
    scorer.variants(["K2R"], WILD, "wt-marginal")  # the unmasked table is another table: one pass
    assert scorer.site_passes == 4


def test_bad_variants_are_error_rows_and_repeats_are_refused(scorer):
    rows = scorer.variants(["K2R", "X2R", "K2B:K2R", None], WILD)
    assert [r["status"] for r in rows] == ["ok", "error", "error", "error"]
    assert "not X" in rows[1]["error"] and "mutated twice" in rows[2]["error"]
    with pytest.raises(UserError, match="'K2R' appears twice"):
        scorer.variants(["K2R", "K2R"], WILD)
    with pytest.raises(UserError, match="not one of"):
        scorer.variants(["K2R"], WILD, strategy="masked")


def test_the_stage_adds_typed_columns_to_every_batch_kind(protein, scorer):
    stage = VariantsStage(protein, target_seq=WILD, device="cpu", batch_tokens=100)
    table = stage(pa.table({"key": [1, 2, 3], "mutant": ["K2R", "A4G:Q9E", "K2R"]}))
    assert table.column_names == ["key", "mutant", "score", "n_mutations", "status", "error"]
    expected = {r["mutant"]: r["score"] for r in scorer.variants(["K2R", "A4G:Q9E"], WILD)}
    want = [expected["K2R"], expected["A4G:Q9E"], expected["K2R"]]  # other batches: equal within float32 rounding
    assert all(abs(a - b) <= 1e-5 for a, b in zip(table["score"].to_pylist(), want))
    failed = stage(pa.table({"mutant": ["Z2R"]}))  # a batch of error rows keeps its types
    assert failed.schema.field("score").type == pa.float64() and failed["status"].to_pylist() == ["error"]
    per_row = VariantsStage(protein, strategy="pll", device="cpu", prefix="esm_")
    frame = per_row(pd.DataFrame({"mutant": ["K2R", "K2R", None], "target_seq": [WILD, WILD[:10], WILD]}))
    assert list(frame.columns[-4:]) == ["esm_score", "esm_n_mutations", "esm_status", "esm_error"]
    assert frame["esm_status"].tolist() == ["ok", "ok", "error"]
    assert frame["esm_score"][0] != frame["esm_score"][1]  # each row against its own wild type
    with pytest.raises(ColumnError, match="target_column="):
        VariantsStage(protein, device="cpu")(pa.table({"mutant": ["K2R"]}))
    with pytest.raises(ColumnError, match="prefix="):
        stage(pa.table({"mutant": ["K2R"], "score": [1.0]}))
