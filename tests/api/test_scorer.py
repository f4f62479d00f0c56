"""`MLMScorer` against the naive reference, against `dscore score`/`infill`/`sample`/`joints` rows for the same
texts, and on bad inputs."""

from __future__ import annotations

import io
import json
import logging
import math
from contextlib import redirect_stdout

import numpy as np
import pyarrow.parquet as pq
import pytest

from distributed_scoring import MLMScorer, UserError
from distributed_scoring.cli import main
from distributed_scoring.config import VARIANTS
from distributed_scoring.engine.joint_stats import CONSTRUCTIONS
from distributed_scoring.io import schema as S

from helpers.pll import TEXTS, assert_same
from helpers.reference import NaiveScorer

BAD = ["", "   ", None, 7, "the " * 200, "lone \ud800 surrogate"]
BAD_ERRORS = [
    "empty or whitespace-only text",
    "empty or whitespace-only text",
    "text is missing (null)",
    "text is a int, not a string",
    "over the model's maximum",
    "lone surrogate",
]


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return str(tiny_model_dir("bert"))


@pytest.fixture(scope="module")
def scorer(bert):
    return MLMScorer(bert, device="cpu")


@pytest.fixture(scope="module")
def strict(bert):
    """A scorer that leaves a text longer than the model's window as an error row, as before windows."""
    return MLMScorer(bert, device="cpu", long_texts="error")


def cli(*args: object) -> None:
    with redirect_stdout(io.StringIO()):
        assert main([str(a) for a in args]) == 0


def without_internal(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in (S.ID, S.MODEL)}


def cli_rows(folder, key: str = S.ID) -> dict[str, dict]:
    return {r[key]: r for r in pq.read_table(folder / "rows").to_pylist()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_token_scores_equal_the_naive_reference(bert, variant):
    scorer = MLMScorer(bert, device="cpu", variant=variant, batch_tokens=64)  # sentences split across batches
    naive = NaiveScorer(scorer.mlm.model, scorer.mlm.tokenizer)
    for text, got, pll in zip(TEXTS, scorer.token_score(TEXTS), scorer.pll(TEXTS)):
        expected = naive.token_logprobs(text, variant)
        tokens = scorer.mlm.tokenizer.convert_ids_to_tokens(
            scorer.mlm.tokenizer(text, add_special_tokens=False)["input_ids"]
        )
        assert [t for t, _ in got] == tokens
        np.testing.assert_allclose([lp for _, lp in got], expected, rtol=0, atol=1e-5, err_msg=text)
        assert pll == pytest.approx(expected.sum(), abs=1e-5)


def test_rows_equal_dscore_score_rows_for_the_same_texts(tmp_path, bert, scorer):
    texts = TEXTS + ["Colourless green ideas sleep furiously.", "", "the " * 200]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cli(
        "score",
        corpus,
        "--model",
        bert,
        "--output",
        tmp_path / "out",
        "--per-token",
        "--word-scores",
        "--shard-rows",
        "4",
        "--device",
        "cpu",
    )
    expected = cli_rows(tmp_path / "out")
    got = scorer.score(texts, per_token=True, word_scores=True)
    assert len(got) == len(texts)
    for i, row in enumerate(got):
        assert_same(
            row, {k: v for k, v in expected[f"in.jsonl:{i + 1}"].items() if k not in (S.ID, S.MODEL, S.VARIANT)}
        )
    assert scorer.pppl(texts) == pytest.approx(
        json.loads((tmp_path / "out" / "summary.json").read_text())["pppl_token"]
    )
    assert scorer.pppl(texts, per="word") == pytest.approx(
        json.loads((tmp_path / "out" / "summary.json").read_text())["pppl_word"]
    )


def test_word_scores_pair_words_with_their_sums(scorer):
    (rows,), (words,) = (
        scorer.score(["the lazy dog."], per_token=True, word_scores=True),
        scorer.word_score(["the lazy dog."]),
    )
    assert [w for w, _ in words] == ["the", "lazy", "dog."]
    assert [s for _, s in words] == rows[S.WORD_SCORES]
    assert sum(s for _, s in words) == pytest.approx(rows[S.PLL])


def test_bad_inputs_are_nan_or_none_with_one_warning_and_their_reasons(strict, caplog):
    scorer = strict
    texts = ["the quick brown fox", *BAD]
    with caplog.at_level(logging.WARNING, logger="distributed_scoring.api.scorer"):
        plls = scorer.pll(texts)
    assert plls[0] < 0 and all(math.isnan(p) for p in plls[1:])
    assert len(caplog.records) == 1 and "6 of 7 texts could not be scored" in caplog.text
    assert scorer.token_score(texts)[1:] == [None] * 6 and scorer.word_score(texts)[1:] == [None] * 6
    rows = scorer.score(texts)
    assert [r[S.STATUS] for r in rows] == ["ok"] + ["error"] * 6
    for row, reason in zip(rows[1:], BAD_ERRORS):
        assert reason in row[S.ERROR] and row[S.PLL] is None and row[S.N_TOKENS] == 0
    assert scorer.pppl(texts) == pytest.approx(math.exp(-plls[0] / rows[0][S.N_TOKENS]))
    assert math.isnan(scorer.pppl(BAD)) and scorer.pll([]) == []


def test_mistakes_that_concern_every_text_raise_before_work(bert, scorer):
    with pytest.raises(UserError, match="single string"):
        scorer.pll("the quick brown fox")
    with pytest.raises(UserError, match="per must be"):
        scorer.pppl(["the fox"], per="sentence")
    with pytest.raises(UserError, match="device 'tpu'"):
        MLMScorer(bert, device="tpu")
    with pytest.raises(UserError, match="dtype 'float8'"):
        MLMScorer(bert, dtype="float8")
    with pytest.raises(UserError, match="variant"):
        MLMScorer(bert, device="cpu", variant="l2r")
    with pytest.raises(UserError, match="does not exist"):
        MLMScorer("./no/such/model")


def test_the_device_is_auto_by_default_and_errors_name_python_arguments(bert, scorer, monkeypatch):
    """On a CPU machine `MLMScorer(model)` runs on the CPU; asking for CUDA there, or for more fills than
    the beam keeps, is an error that names the API's arguments (`device="cpu"`), not the CLI's flags."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert MLMScorer(bert).signature["device"] == "cpu"
    with pytest.raises(UserError) as raised:
        MLMScorer(bert, device="cuda")
    assert 'use device="cpu", or device="auto"' in str(raised.value) and "--" not in str(raised.value)
    with pytest.raises(UserError) as raised:
        scorer.infill(["the [MASK] fox"], beam=2, top=3)
    assert str(raised.value).startswith("top=3 is more than beam=2") and "--" not in str(raised.value)


def test_batching_dtype_and_progress(bert, scorer, capsys):
    reference = scorer.pll(TEXTS)
    tiny_budget = MLMScorer(bert, device="cpu", batch_tokens=16, progress=True)
    np.testing.assert_allclose(tiny_budget.pll(TEXTS), reference, rtol=0, atol=1e-5)
    assert f"{len(TEXTS)}/{len(TEXTS)}" in capsys.readouterr().err  # the bar reached the end
    precise = MLMScorer(bert, device="cpu", dtype="float64")
    assert precise.signature["dtype"] == "float64"
    np.testing.assert_allclose(precise.pll(TEXTS), reference, rtol=0, atol=1e-4)
    assert "variant='original'" in repr(scorer)


def test_infill_rows_equal_dscore_infill_rows(tmp_path, bert, scorer):
    records = [
        {"id": "a", "text": "the quick [MASK] fox [MASK] over the lazy dog", "answer": "the and"},
        {"id": "b", "text": "no mask here"},
        {"id": "c", "text": "colourless green [MASK] sleep", "answer": "rec"},
    ]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    for decoder in ("hcb", "top-p"):
        out = tmp_path / decoder
        cli(
            "infill",
            corpus,
            "--model",
            bert,
            "--output",
            out,
            "--id-column",
            "id",
            "--decoder",
            decoder,
            "--beam",
            "3",
            "--seed",
            "4",
            "--vocab-restrict",
            "the com and rec cor over",
            "--device",
            "cpu",
        )
        got = scorer.infill(
            [r["text"] for r in records],
            answers=[r.get("answer") for r in records],
            ids=[r["id"] for r in records],
            decoder=decoder,
            beam=3,
            seed=4,
            vocab_restrict=["the", "com", "and", "rec", "cor", "over"],
        )
        expected = cli_rows(out)
        for record, row in zip(records, got):
            want = without_internal(expected[record["id"]])
            for beam, want_beam in zip(row["beams"] or [], want["beams"] or []):
                assert_same(beam, want_beam)
            assert_same({**row, "beams": None}, {**want, "beams": None})
    assert got[1]["status"] == "error" and "no mask token" in got[1]["error"]
    with pytest.raises(UserError, match="pivot='zzzq' is not a token"):  # the API's argument, not the CLI's --pivot
        scorer.infill(["the [MASK] fox"], decoder="hcb", pivot="zzzq")


def test_sample_rows_equal_dscore_sample_rows(tmp_path, bert, scorer):
    records = [
        {"id": "a", "text": "the quick [MASK] fox [MASK] over", "answer": "the and"},
        {"id": "b", "text": "no mask"},
    ]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    cli(
        "sample",
        corpus,
        "--model",
        bert,
        "--output",
        tmp_path / "o",
        "--id-column",
        "id",
        "--chains",
        "2",
        "--epochs",
        "3",
        "--seed",
        "5",
        "--vocab-restrict",
        "the com and rec cor over",
        "--device",
        "cpu",
    )
    expected = sorted(
        pq.read_table(tmp_path / "o" / "rows").to_pylist(), key=lambda r: (r["id"], r["chain"], r["epoch"] or 0)
    )
    got = scorer.sample(
        [r["text"] for r in records],
        answers=[r.get("answer") for r in records],
        ids=["a", "b"],
        chains=2,
        epochs=3,
        seed=5,
        vocab_restrict=["the", "com", "and", "rec", "cor", "over"],
    )
    assert [len(rows) for rows in got] == [6, 6]
    flat = [row for rows in got for row in rows]
    assert len(flat) == len(expected)
    for row, want in zip(flat, expected):
        assert_same(row, without_internal(want))


def test_joints_rows_equal_dscore_joints_rows(tmp_path, bert, scorer):
    given = [("The quick brown fox.", [0, 2]), ("Hi", [0, 5]), ("Same index twice", [1, 1])]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"id": str(i), "text": t, "positions": p}) + "\n" for i, (t, p) in enumerate(given))
    )
    cli("joints", pairs, "--model", bert, "--output", tmp_path / "j", "--top-k", "6", "--device", "cpu")
    expected = {(r[S.ID], r["construction"]): r for r in pq.read_table(tmp_path / "j" / "scores" / "rows").to_pylist()}
    got = scorer.joints([t for t, _ in given], pairs=[tuple(p) for _, p in given], top_k=6)
    for i, constructions in enumerate(got):
        assert list(constructions) == list(CONSTRUCTIONS)
        for name, row in constructions.items():
            want = without_internal(expected[(str(i), name)])
            if i == 2:  # a malformed pair: the CLI keeps no text for it
                assert row[S.STATUS] == want[S.STATUS] == "error" and "two different" in row[S.ERROR]
            else:
                assert_same(row, want)
    drawn = scorer.joints(TEXTS[:3], scheme="contiguous", seed=3, top_k=4)
    assert all(rows["MLM"]["b"] == rows["MLM"]["a"] + 1 for rows in drawn)
    assert drawn == scorer.joints(TEXTS[:3], scheme="contiguous", seed=3, top_k=4)


def test_chain_equals_the_naive_chain_along_each_order(bert):
    from helpers.reference import NaiveChain, scored_positions

    scorer = MLMScorer(bert, device="cpu", batch_tokens=50)
    naive = NaiveChain(scorer.mlm.model, scorer.mlm.mask_token_id)
    texts = ["the quick brown fox", "Hi", ""]
    for order, k in (("l2r", 1), ("r2l", 1), ("random", 3)):
        rows = scorer.chain(texts, order=order, orders=k, seed=7)
        assert rows == scorer.chain(texts, order=order, orders=k, seed=7)  # orders drawn from (seed, id)
        assert [r[S.STATUS] for r in rows] == ["ok", "ok", "error"] and rows[2]["logp"] is None
        for text, row in zip(texts, rows[:2]):
            ids = scorer.mlm.tokenizer(text)["input_ids"]
            scored = scored_positions(scorer.mlm.tokenizer, ids)
            assert len(row["orders"]) == len(row["logp"]) == k and row[S.N_TOKENS] == len(scored)
            for indices, logp in zip(row["orders"], row["logp"]):
                assert sorted(indices) == list(range(len(scored)))
                assert logp == pytest.approx(naive.log_likelihood(ids, [scored[i] for i in indices]), abs=1e-5)
        if order != "random":
            step = 1 if order == "l2r" else -1
            assert rows[0]["orders"] == [list(range(rows[0][S.N_TOKENS]))[::step]]
    randoms = scorer.chain(texts[:1], order="random", orders=3, seed=8)[0]["orders"]
    assert randoms != rows[0]["orders"] and len({tuple(o) for o in randoms}) == 3
    with pytest.raises(UserError, match="exactly one"):
        scorer.chain(texts, order="l2r", orders=2)
    with pytest.raises(UserError, match="not one of"):
        scorer.chain(texts, order="best")
