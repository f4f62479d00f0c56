"""`dscore joints` end to end: examples drawn or given, scored through the pipeline, Table-1 report."""

from __future__ import annotations

import json
import math
import random

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.engine.joints import CONSTRUCTIONS
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.workloads.joints import draw_pair

from helpers import tiny

METRICS = ("U-PPL", "P-PPL", "A-KL", "G-KL")


def run(capsys, *args) -> dict:
    assert main(["joints", *map(str, args)]) == 0
    return json.loads(capsys.readouterr().out)


def test_draw_pair_schemes():
    rng = random.Random(0)
    for n in (2, 3, 10):
        a, b = draw_pair(n, "contiguous", rng)
        assert b == a + 1 and 0 <= a < n - 1
        a, b = draw_pair(n, "random", rng)
        assert 0 <= a < b < n
    assert {draw_pair(4, "random", rng) for _ in range(300)} == {(a, b) for a in range(4) for b in range(a + 1, 4)}


def test_given_pairs_error_rows_and_resumable_determinism(tmp_path, tiny_model_dir, capsys):
    model = tiny_model_dir("bert")
    given = tmp_path / "pairs.jsonl"
    given.write_text(
        json.dumps({"id": "ok", "text": "The quick brown fox.", "positions": [0, 2]})
        + "\n"
        + json.dumps({"text": "Hi", "positions": [0, 5]})
        + "\n"
        + json.dumps({"text": "Same index twice", "positions": [1, 1]})
        + "\n"
    )
    summary = run(capsys, given, "--model", model, "--output", tmp_path / "given")
    assert set(summary["report"]) == {"given"} and (summary["scored"], summary["errors"]) == (1, 2)
    assert json.loads((tmp_path / "given" / "report.json").read_text()) == summary["report"]
    rows = pq.read_table(tmp_path / "given" / "scores" / "rows").to_pylist()
    assert len(rows) == 3 * len(CONSTRUCTIONS)
    errors = {r["id"]: r["error"] for r in rows if r["status"] == "error"}
    assert "out of range" in errors["pairs.jsonl:2"] and "positions" in errors["pairs.jsonl:3"]
    assert {(r["a"], r["b"]) for r in rows if r["id"] == "ok"} == {(0, 2)}

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    one = run(capsys, corpus, "--model", model, "--output", tmp_path / "a", "--examples", "5", "--seed", "3")
    two = run(
        capsys,
        corpus,
        "--model",
        model,
        "--output",
        tmp_path / "b",
        "--examples",
        "5",
        "--seed",
        "3",
        "--shard-rows",
        "2",
        "--batch-tokens",
        "200",
    )
    pairs = [
        {(r["id"], r["a"], r["b"]) for r in pq.read_table(tmp_path / d / "scores" / "rows").to_pylist()} for d in "ab"
    ]
    assert pairs[0] == pairs[1] and len(pairs[0]) == 5
    for construction in CONSTRUCTIONS:
        for metric in METRICS:
            assert one["report"]["random"][construction][metric] == pytest.approx(
                two["report"]["random"][construction][metric], rel=1e-5, abs=1e-5
            )  # batching moves fp32
    assert (
        main(
            [
                "joints",
                str(corpus),
                "--model",
                str(model),
                "--output",
                str(tmp_path / "a"),
                "--examples",
                "5",
                "--seed",
                "3",
                "--ag-iterations",
                "7",
            ]
        )
        == 2
    )  # other options: not silently resumed
    assert "different run" in capsys.readouterr().err


def test_examples_are_drawn_only_from_sentences_with_a_pair_of_tokens(tmp_path, tiny_model_dir, capsys):
    """Blank lines and one-token lines used to be drawn and then scored as error rows."""
    readable = tiny.CORPUS[:2]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["", "   ", "the", *readable, "", "\t", "the", ""] * 2) + "\n")
    summary = run(capsys, corpus, "--model", tiny_model_dir("bert"), "--output", tmp_path / "out", "--examples", "4")
    assert (summary["scored"], summary["errors"]) == (4, 0)
    drawn = pq.read_table(tmp_path / "out" / "scores" / "rows").to_pylist()
    assert {r["text"] for r in drawn} == set(readable) and all(r["status"] == "ok" for r in drawn)


@pytest.mark.ray
@pytest.mark.parametrize("scheme", ["random", "contiguous"])
def test_antiberty_joints_through_ray_report_every_metric(ray_local, tmp_path, offline_model_dir, capsys, scheme):
    chains = [spaced(g[:30]) for g in random.Random(0).sample(sorted(v_genes("human").values()), 12)]
    corpus = tmp_path / "chains.txt"
    corpus.write_text("\n".join(chains) + "\n")
    summary = run(
        capsys,
        corpus,
        "--model",
        offline_model_dir("antiberty"),
        "--output",
        tmp_path / "out",
        "--scheme",
        scheme,
        "--examples",
        "6",
        "--ray",
        "--shard-rows",
        "3",
    )
    report = summary["report"][scheme]
    assert summary["scored"] == 6 and summary["errors"] == 0
    for construction in CONSTRUCTIONS:
        values = report[construction]
        assert set(values) == set(METRICS) and all(math.isfinite(values[m]) for m in METRICS), (construction, values)
        # KLs are >= 0 up to float32 rounding: a joint that matches its conditionals gives about -1e-7
        assert values["U-PPL"] >= 1 and values["P-PPL"] >= 1 and values["A-KL"] >= -1e-6 and values["G-KL"] >= -1e-6
    # Real antibody residues are far more predictable than the 25-token vocabulary's uniform.
    assert report["MLM"]["U-PPL"] < 10
    md = (tmp_path / "out" / "report.md").read_text()
    assert all(f"| {c} |" in md for c in CONSTRUCTIONS) and f"{scheme} P-PPL" in md
