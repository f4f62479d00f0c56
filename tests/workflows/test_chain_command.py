"""`dscore score --method chain` end to end: rows against the naive chain, random orders averaged in
probability space, the summary's PPL and spread, seeds, flag errors, and Ray."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.orders import orders_for
from distributed_scoring.io import schema as S
from distributed_scoring.workloads.chain import CHAIN_FIELDS
from distributed_scoring.workloads.infill import example_seed

from helpers.reference import NaiveChain, scored_positions

TEXTS = ["the quick brown fox", "she sells seashells", "", "colourless green ideas sleep"]


def run(capsys, *args) -> tuple[int, dict | None, str]:
    code = main(["score", *map(str, args)])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def rows_of(folder) -> dict[str, dict]:
    return {r[S.ID]: r for r in pq.read_table(folder / "rows").to_pylist()}


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return tiny_model_dir("bert")


@pytest.fixture(scope="module")
def naive(model):
    mlm = load_masked_lm(ModelSpec(str(model)))
    return NaiveChain(mlm.model, mlm.mask_token_id), mlm.tokenizer


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


@pytest.mark.parametrize("order", ["l2r", "r2l"])
def test_rows_are_the_naive_chain_in_the_pll_schema(order, corpus, tmp_path, model, naive, capsys):
    chain, tokenizer = naive
    code, summary, _ = run(
        capsys,
        corpus,
        "--model",
        model,
        "--output",
        tmp_path / "o",
        "--method",
        "chain",
        "--order",
        order,
        "--dtype",
        "float64",
    )
    assert code == 0
    rows = rows_of(tmp_path / "o")
    assert list(pq.read_schema(next((tmp_path / "o" / "rows").glob("*.parquet"))).names)[-len(CHAIN_FIELDS) :] == [
        f.name for f in CHAIN_FIELDS
    ]
    total, tokens = 0.0, 0
    for line, text in enumerate(TEXTS, start=1):
        row = rows[f"in.txt:{line}"]
        if not text:
            assert row["status"] == "error" and row["log_likelihood"] is None and row["n_tokens"] == 0
            continue
        ids = tokenizer(text)["input_ids"]
        positions = scored_positions(tokenizer, ids)
        want = chain.log_likelihood(ids, positions if order == "l2r" else positions[::-1])
        assert row["log_likelihood"] == pytest.approx(want, abs=1e-9)
        assert row["log_likelihoods"] == [row["log_likelihood"]] and row["log_likelihood_std"] == 0.0
        assert (row["pll"], row["pppl_token"], row["method"], row["order"], row["variant"]) == (
            None,
            None,
            "chain",
            order,
            "chain",
        )
        assert row["n_tokens"] == len(positions) and row["status"] == "ok"
        total, tokens = total + want, tokens + len(positions)
    assert (summary["rows"], summary["ok"], summary["errors"], summary["method"]) == (4, 3, 1, "chain")
    assert summary["ppl_token"] == pytest.approx(math.exp(-total / tokens), rel=1e-9)
    assert summary["by_order"]["ppl_token"] == pytest.approx([summary["ppl_token"]], rel=1e-9)
    assert "u-PMLM" in summary["likelihood"]
    mostly_unknown = sum(1 for r in rows.values() if r["status"] == "ok" and 2 * r["n_unknown"] > r["n_tokens"])
    assert (summary["version"], summary["variant"], summary["mostly_unknown_rows"]) == (1, "chain", mostly_unknown)
    assert bool(summary["warnings"]) == (mostly_unknown > 0.1 * 3)
    assert summary["by_input"]["in.txt"]["mostly_unknown_rows"] == mostly_unknown


def test_random_orders_are_seeded_and_averaged_in_probability_space(corpus, tmp_path, model, naive, capsys):
    """Each row's K orders are the ones its id and the seed draw; its log_likelihood is log mean p over
    them; the summary's by_order holds the corpus PPL of each order index."""
    chain, tokenizer = naive
    common = [
        "--model",
        model,
        "--method",
        "chain",
        "--order",
        "random",
        "--orders",
        "3",
        "--seed",
        "5",
        "--dtype",
        "float64",
    ]
    code, summary, _ = run(capsys, corpus, "--output", tmp_path / "a", *common)
    assert code == 0 and summary["orders"] == 3 and summary["seed"] == 5
    rows = rows_of(tmp_path / "a")
    per_order, tokens = np.zeros(3), 0
    for line, text in enumerate(TEXTS, start=1):
        if not text:
            continue
        row_id = f"in.txt:{line}"
        ids = tokenizer(text)["input_ids"]
        orders = orders_for(
            np.array(scored_positions(tokenizer, ids)), "random", 3, np.random.default_rng(example_seed(5, row_id))
        )
        want = np.array([chain.log_likelihood(ids, o.tolist()) for o in orders])
        row = rows[row_id]
        np.testing.assert_allclose(row["log_likelihoods"], want, rtol=0, atol=1e-9)
        assert row["log_likelihood"] == pytest.approx(math.log(np.exp(want).mean()), abs=1e-9)
        assert row["log_likelihood_std"] == pytest.approx(want.std(), abs=1e-9) and want.std() > 0
        per_order, tokens = per_order + want, tokens + len(orders[0])
    spread = summary["by_order"]
    assert spread["ppl_token"] == pytest.approx(np.exp(-per_order / tokens).tolist(), rel=1e-9)
    assert spread["min"] <= spread["max"] and spread["std"] > 0
    code, _, _ = run(capsys, corpus, "--output", tmp_path / "b", *common)
    assert code == 0 and rows_of(tmp_path / "b") == rows
    code, _, _ = run(capsys, corpus, "--output", tmp_path / "c", *common[:-4], "--seed", "6")
    assert code == 0 and rows_of(tmp_path / "c")["in.txt:1"]["log_likelihoods"] != rows["in.txt:1"]["log_likelihoods"]


def test_the_default_method_is_the_pll_unchanged(corpus, tmp_path, model, capsys):
    code, summary, _ = run(capsys, corpus, "--model", model, "--output", tmp_path / "o")
    assert code == 0 and "method" not in summary and summary["pppl_token"] > 1
    names = pq.read_schema(next((tmp_path / "o" / "rows").glob("*.parquet"))).names
    assert "log_likelihood" not in names and "method" not in names


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--order", "r2l"], "--order, --orders and --seed belong to --method chain"),
        (["--method", "chain", "--orders", "2"], "only --order random has more than one order"),
        (
            ["--method", "chain", "--order", "random", "--orders", "0"],
            "--orders 0 is out of bounds: it must be at least 1",
        ),
        (["--method", "chain", "--per-token"], "options of --method pll"),
        (["--method", "chain", "--variant", "word_l2r"], "options of --method pll"),
    ],
)
def test_bad_flags_stop_before_work_with_one_line(extra, message, corpus, tmp_path, model, capsys):
    code, _, err = run(capsys, corpus, "--model", model, "--output", tmp_path / "o", *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dscore: error:") and message in lines[0]
    assert not (tmp_path / "o").exists()


def test_an_unknown_order_is_an_argparse_error(corpus, tmp_path, model, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "score",
                str(corpus),
                "--model",
                str(model),
                "--output",
                str(tmp_path / "o"),
                "--method",
                "chain",
                "--order",
                "sideways",
            ]
        )
    assert exit_.value.code == 2 and "--order" in capsys.readouterr().err


@pytest.mark.ray
def test_on_ray_the_rows_equal_in_process(corpus, tmp_path, model, capsys, ray_local):
    common = ["--model", model, "--method", "chain", "--order", "random", "--orders", "2", "--shard-rows", "2"]
    code, local, _ = run(capsys, corpus, "--output", tmp_path / "local", *common)
    code_ray, on_ray, _ = run(capsys, corpus, "--output", tmp_path / "ray", "--ray", *common)
    assert code == code_ray == 0 and local["rows"] == on_ray["rows"] == 4
    assert rows_of(tmp_path / "local").keys() == rows_of(tmp_path / "ray").keys()
    for key, row in rows_of(tmp_path / "local").items():
        other = rows_of(tmp_path / "ray")[key]
        assert row["status"] == other["status"]
        if row["status"] == "ok":
            np.testing.assert_allclose(row["log_likelihoods"], other["log_likelihoods"], rtol=0, atol=1e-5)
    assert on_ray["ppl_token"] == pytest.approx(local["ppl_token"], rel=1e-5)
