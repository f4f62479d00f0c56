"""`dscore sample` end to end: one row per chain per recorded epoch, error rows, seeds, summary, Ray."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pyarrow.parquet as pq
import pytest
from sacrebleu.metrics import BLEU

from distributed_scoring.cli import main

WORDS = "the com and rec cor over"
ROWS = [
    {"id": "a", "text": "the quick [MASK] fox [MASK] over the lazy dog", "answer": "the and"},
    {"id": "b", "text": "she sells seashells by the seashore"},
    {"id": "c", "text": "colourless [MASK] ideas sleep furiously", "answer": "rec"},
]


def run(*args: str) -> tuple[int, dict | None]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue()) if code == 0 else None


def rows_of(folder) -> list[dict]:
    return sorted(pq.read_table(folder / "rows").to_pylist(), key=lambda r: (r["id"], r["chain"], r["epoch"] or 0))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_rows_per_chain_and_epoch_error_rows_and_the_same_command_gives_the_same_chains(
    tmp_path, corpus, tiny_model_dir
):
    common = [
        "--model",
        str(tiny_model_dir("bert")),
        "--id-column",
        "id",
        "--chains",
        "2",
        "--epochs",
        "4",
        "--burn-in",
        "1",
        "--record-every",
        "2",
        "--energy",
        "raw",
        "--vocab-restrict",
        WORDS,
        "--seed",
        "5",
    ]
    code, summary = run("sample", str(corpus), "--output", str(tmp_path / "o1"), *common)
    assert code == 0 and summary["rows"] == 3 * 2 * 2 and summary["errors"] == 2 * 2
    rows = rows_of(tmp_path / "o1")
    ok = [r for r in rows if r["status"] == "ok"]
    assert sorted({(r["id"], r["chain"], r["epoch"]) for r in ok}) == [
        (i, c, e) for i in ("a", "c") for c in (0, 1) for e in (3, 5)
    ]  # epochs count the burn-in: 1 + 2, 1 + 4
    assert all(
        r["text"].startswith("the quick ") and r["text"].endswith(" over the lazy dog") for r in ok if r["id"] == "a"
    )
    assert {r["error"] for r in rows if r["id"] == "b"} == {
        "nothing to sample: no mask token '[MASK]' in the text; mark the positions to sample with it, or pass "
        "--free-all to sample every position"
    }
    proposals = sum(r["proposals"] for r in ok)
    assert summary["acceptance_rate"] == pytest.approx(sum(r["accepted"] for r in ok) / proposals)
    assert summary["novel_rate"] == pytest.approx(sum(r["novel"] for r in ok) / proposals)
    assert set(summary["energy_by_epoch"]) == {"3", "5"} and 0 <= summary["accuracy"]["final"] <= 1
    final = [r for r in ok if r["epoch"] == 5]
    assert all(r["text"].split()[2] == r["sampled"].split()[0] for r in final if r["id"] == "a")
    expected = (
        BLEU(tokenize="none", max_ngram_order=1)
        .corpus_score([r["sampled"] for r in final], [[r["answer"] for r in final]])
        .score
    )
    assert summary["bleu"]["final"] == {"score": pytest.approx(expected), "max_ngram_order": 1}
    assert (tmp_path / "o1" / "energy.png").read_bytes()[:4] == b"\x89PNG"
    with redirect_stdout(io.StringIO()):  # several rows per id (error rows too), told apart by chain and epoch
        assert main(["verify", str(tmp_path / "o1")]) == 0
    code, _ = run("sample", str(corpus), "--output", str(tmp_path / "o2"), *common)
    assert code == 0 and rows_of(tmp_path / "o2") == rows  # seeds recorded: the same chains again


def test_free_all_samples_every_position_from_the_given_text(tmp_path, tiny_model_dir):
    corpus = tmp_path / "in.txt"
    corpus.write_text("the cor and rec\n")
    code, summary = run(
        "sample",
        str(corpus),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(tmp_path / "o"),
        "--free-all",
        "--sampler",
        "block-mh",
        "--block",
        "2",
        "--epochs",
        "2",
        "--vocab-restrict",
        WORDS,
    )
    rows = rows_of(tmp_path / "o")
    assert code == 0 and summary["ok"] == 2 and all(r["n_sampled"] == 4 for r in rows)
    assert all(set(r["text"].split()) <= set(WORDS.split()) for r in rows)


def test_forced_epochs_accept_every_proposal(tmp_path, corpus, tiny_model_dir):
    common = [
        "--model",
        str(tiny_model_dir("bert")),
        "--id-column",
        "id",
        "--epochs",
        "3",
        "--burn-in",
        "2",
        "--vocab-restrict",
        WORDS,
        "--energy",
        "raw",
        "--proposal-temperature",
        "3",
    ]
    _, forced = run("sample", str(corpus), "--output", str(tmp_path / "f"), "--forced-accept", "5", *common)
    _, free = run("sample", str(corpus), "--output", str(tmp_path / "m"), *common)
    assert forced["acceptance_rate"] == 1 and forced["forced_accept"] == 5 and free["acceptance_rate"] < 1


def test_bad_options_stop_before_work(tmp_path, corpus, tiny_model_dir, capsys):
    model = str(tiny_model_dir("bert"))
    for extra, message in (
        (["--block", "2"], "use --sampler block-mh"),
        (["--top-p", "0"], "--top-p 0 is out of bounds: it must be in (0, 1]"),
        (["--vocab-restrict", "zzzq"], "not in the model's vocabulary"),
        (["--forced-accept", "-1"], "--forced-accept -1 is out of bounds: it must be at least 0"),
    ):
        code, _ = run("sample", str(corpus), "--model", model, "--output", str(tmp_path / "o"), *extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and message in err[-1] and "Traceback" not in err[-1]
    assert not (tmp_path / "o").exists()


@pytest.mark.ray
def test_on_ray_the_chains_equal_in_process(tmp_path, corpus, tiny_model_dir, ray_local):
    common = [
        "--model",
        str(tiny_model_dir("bert")),
        "--id-column",
        "id",
        "--chains",
        "2",
        "--epochs",
        "2",
        "--sampler",
        "block-mh",
        "--block",
        "2",
        "--vocab-restrict",
        WORDS,
        "--shard-rows",
        "1",
    ]
    code, _ = run("sample", str(corpus), "--output", str(tmp_path / "local"), *common)
    code_ray, _ = run("sample", str(corpus), "--output", str(tmp_path / "ray"), "--ray", *common)
    assert code == code_ray == 0 and rows_of(tmp_path / "local") == rows_of(tmp_path / "ray")
