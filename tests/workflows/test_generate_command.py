"""`dscore generate` end to end: constraints kept, greedy against the naive Algorithm 1, seeded samples
scored by their chain, --length prompts, error rows, flag errors, and Ray."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.io import schema as S

from helpers.reference import NaiveChain

PROMPTS = [
    {"id": "prefix", "text": "the quick [MASK] [MASK] [MASK]", "fill_order": [2, 0, 1]},
    {"id": "suffix", "text": "[MASK] [MASK] over the lazy dog", "fill_order": "1 0"},
    {"id": "middle", "text": "she [MASK] seashells [MASK] the seashore", "fill_order": [0, 1]},
]


def run(capsys, *args) -> tuple[int, dict | None, str]:
    code = main(["generate", *map(str, args)])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def rows_of(folder) -> list[dict]:
    return sorted(pq.read_table(folder / "rows").to_pylist(), key=lambda r: (r[S.ID], r["sequence"]))


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return tiny_model_dir("bert")


@pytest.fixture(scope="module")
def mlm(model):
    return load_masked_lm(ModelSpec(str(model)))


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def masks_of(mlm, text: str) -> tuple[list[int], list[int]]:
    ids = mlm.tokenizer(text)["input_ids"]
    return ids, [i for i, t in enumerate(ids) if t == mlm.mask_token_id]


def allowed_ids(mlm) -> list[int]:
    specials = set(mlm.tokenizer.all_special_ids)
    return [t for t in range(len(mlm.tokenizer)) if t not in specials]


def test_greedy_in_the_given_order_is_the_naive_algorithm_and_keeps_the_prompt(prompts, tmp_path, model, mlm, capsys):
    code, summary, _ = run(
        capsys,
        prompts,
        "--model",
        model,
        "--output",
        tmp_path / "o",
        "--id-column",
        "id",
        "--order",
        "given",
        "--temperature",
        "0",
        "--dtype",
        "float64",
    )
    assert code == 0 and (summary["rows"], summary["ok"]) == (3, 3)
    naive = NaiveChain(mlm.model, mlm.mask_token_id)
    for row, prompt in zip(rows_of(tmp_path / "o"), sorted(PROMPTS, key=lambda p: p["id"])):
        ids, masks = masks_of(mlm, prompt["text"])
        order = [int(i) for i in str(prompt["fill_order"]).strip("[]").replace(",", " ").split()]
        filled, score = naive.greedy(ids, [masks[i] for i in order], allowed_ids(mlm))
        assert row["tokens"] == mlm.tokenizer.convert_ids_to_tokens([filled[m] for m in masks])
        assert row["fill_order"] == order and row["log_likelihood"] == pytest.approx(score, abs=1e-9)
        fixed = prompt["text"].split()
        assert [w for w, f in zip(row["text"].split(), fixed) if f != "[MASK]"] == [f for f in fixed if f != "[MASK]"]
        assert (row["prompt"], row["n_tokens"], row["order"], row["status"]) == (
            prompt["text"],
            len(masks),
            "given",
            "ok",
        )
    assert summary["ppl_token"] > 1


def test_sampling_is_seeded_and_each_sample_carries_its_chain(prompts, tmp_path, model, mlm, capsys):
    """Three random-order samples per prompt: the same command gives the same rows, another seed others;
    each row's log_likelihood is the naive chain of its text along its fill order."""
    common = ["--model", model, "--id-column", "id", "--num-sequences", "3", "--top-p", "0.9", "--seed", "4"]
    code, summary, _ = run(capsys, prompts, "--output", tmp_path / "a", *common)
    assert code == 0 and summary["rows"] == 9
    rows = rows_of(tmp_path / "a")
    assert [(r[S.ID], r["sequence"]) for r in rows] == [
        (p, n) for p in ("middle", "prefix", "suffix") for n in range(3)
    ]
    code, _, _ = run(capsys, prompts, "--output", tmp_path / "b", *common)
    assert rows_of(tmp_path / "b") == rows
    code, _, _ = run(capsys, prompts, "--output", tmp_path / "c", *common[:-1], "5")
    assert [r["text"] for r in rows_of(tmp_path / "c")] != [r["text"] for r in rows]
    assert len({tuple(r["fill_order"]) for r in rows if r[S.ID] == "prefix"}) > 1  # orders drawn per sequence
    naive = NaiveChain(mlm.model, mlm.mask_token_id)
    for row in rows:
        prompt = next(p for p in PROMPTS if p["id"] == row[S.ID])
        ids, masks = masks_of(mlm, prompt["text"])
        for m, token in zip(masks, mlm.tokenizer.convert_tokens_to_ids(row["tokens"])):
            ids[m] = token
        want = naive.log_likelihood(ids, [masks[i] for i in row["fill_order"]])
        assert row["log_likelihood"] == pytest.approx(want, abs=1e-5)
    code, verified = main(["verify", str(tmp_path / "a")]), capsys.readouterr().out
    assert code == 0 and verified.startswith("OK")


def test_temperature_towards_zero_is_greedy(prompts, tmp_path, model, capsys):
    common = ["--model", model, "--id-column", "id", "--order", "l2r"]
    run(capsys, prompts, "--output", tmp_path / "greedy", *common, "--temperature", "0")
    run(capsys, prompts, "--output", tmp_path / "cold", *common, "--temperature", "1e-7")
    assert [r["text"] for r in rows_of(tmp_path / "greedy")] == [r["text"] for r in rows_of(tmp_path / "cold")]


def test_length_writes_its_prompts_and_resumes(tmp_path, model, mlm, capsys):
    common = [
        "--model",
        model,
        "--output",
        tmp_path / "o",
        "--length",
        "6",
        "--num-sequences",
        "5",
        "--top-k",
        "20",
        "--shard-rows",
        "2",
        "--overwrite",
    ]
    code, summary, _ = run(capsys, *common)
    assert code == 0 and (summary["rows"], summary["ok"], summary["n_tokens"]) == (5, 5, 30)
    rows = rows_of(tmp_path / "o")
    assert [r[S.ID] for r in rows] == ["0", "1", "2", "3", "4"] and all(r["sequence"] == 0 for r in rows)
    for row in rows:
        assert row["prompt"] is None and len(row["tokens"]) == 6 and sorted(row["fill_order"]) == list(range(6))
        assert row["text"] == mlm.tokenizer.decode(mlm.tokenizer.convert_tokens_to_ids(row["tokens"]))
    assert len(list((tmp_path / "o" / "prompts").iterdir())) == 1
    code, again, _ = run(capsys, *common[:-1])
    assert code == 0 and again["sequences_per_s"] is None and rows_of(tmp_path / "o") == rows  # resumed


def test_prompts_that_cannot_be_generated_are_error_rows(tmp_path, model, capsys):
    path = tmp_path / "in.jsonl"
    records = [
        {"id": "none", "text": "no mask here", "fill_order": []},
        {"id": "missing", "text": "the [MASK] fox"},
        {"id": "short", "text": "the [MASK] [MASK] fox", "fill_order": [1]},
        {"id": "words", "text": "the [MASK] fox", "fill_order": "first"},
        {"id": "null", "text": None},
        {"id": "good", "text": "the [MASK] fox", "fill_order": [0]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, summary, _ = run(
        capsys,
        path,
        "--model",
        model,
        "--output",
        tmp_path / "o",
        "--id-column",
        "id",
        "--order",
        "given",
        "--num-sequences",
        "2",
    )
    assert code == 0 and (summary["rows"], summary["ok"], summary["errors"]) == (12, 2, 10)
    errors = {r[S.ID]: r["error"] for r in rows_of(tmp_path / "o") if r["sequence"] == 0}
    assert "no mask token '[MASK]'" in errors["none"]
    assert "no 'fill_order' value" in errors["missing"]
    assert "'1' is not a permutation of the 2 mask indices" in errors["short"]
    assert "'first' is not a permutation" in errors["words"]
    assert errors["null"] == "text is missing (null)" and errors["good"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--length", "4", "PROMPTS"], "not both or neither"),
        ([], "not both or neither"),
        (["--length", "4", "--order", "given"], "--length has no inputs"),
        (["PROMPTS", "--temperature", "-1"], "--temperature -1 is out of bounds: it must be at least 0"),
        (["PROMPTS", "--top-p", "0"], "--top-p 0 is out of bounds: it must be in (0, 1]"),
        (["PROMPTS", "--top-k", "-2"], "--top-k -2 is out of bounds: it must be at least 0"),
        (["--length", "0"], "--length 0 is out of bounds: it must be at least 1"),
        (["--length", "95"], "over the model's maximum of 96 tokens"),
        (["PROMPTS", "--vocab-restrict", "zzzq"], "not in the model's vocabulary: zzzq"),
    ],
)
def test_bad_flags_stop_before_work_with_one_line(extra, message, prompts, tmp_path, model, capsys):
    args = [str(prompts) if a == "PROMPTS" else a for a in extra]
    code, _, err = run(capsys, *args, "--model", model, "--output", tmp_path / "o")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("dscore: error:") and message in lines[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.ray
def test_on_ray_the_rows_equal_in_process(prompts, tmp_path, model, capsys, ray_local):
    common = ["--model", model, "--id-column", "id", "--num-sequences", "2", "--shard-rows", "2"]
    code, local, _ = run(capsys, prompts, "--output", tmp_path / "local", *common)
    code_ray, on_ray, _ = run(capsys, prompts, "--output", tmp_path / "ray", "--ray", *common)
    assert code == code_ray == 0 and local["rows"] == on_ray["rows"] == 6
    assert [r["text"] for r in rows_of(tmp_path / "local")] == [r["text"] for r in rows_of(tmp_path / "ray")]
