"""`dscore infill` end to end: error rows with reasons, answers ranked, the summary's figures, Ray and resume."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.workloads.infill import InfillOptions, InfillPreparer, allowed_tokens

from helpers.reference import NaiveInfill

WORDS = ("the", "com", "and", "rec", "cor", "over")  # whole-word tokens of the tiny WordPiece vocabulary
TEXTS = {
    "a": "the quick [MASK] fox [MASK] over the lazy dog",
    "b": "she sells [MASK] by the seashore",
    "c": "colourless green [MASK] sleep [MASK]",
}


def rows_of(folder) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(folder / "rows").to_pylist()}


def same(a, b, tol: float = 1e-5) -> bool:
    """Equal rows, scores within the fp32 tolerance: a Ray actor runs with other intra-op threads than
    the driver, so sums may round in another order (seen: 4.3228817 against 4.3228819)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol * max(1.0, abs(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b))
    return a == b


def run(*args: str) -> tuple[int, dict | None]:
    import io
    from contextlib import redirect_stdout

    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue()) if code == 0 else None


def exact_fills(model_dir, text: str) -> list[tuple[str, ...]]:
    """Every fill of `text` over WORDS, best first under the chain score, by brute force."""
    mlm = load_masked_lm(ModelSpec(str(model_dir), dtype="float64"))
    vocab = mlm.tokenizer.get_vocab()
    ids = mlm.tokenizer(text)["input_ids"]
    masks = [i for i, t in enumerate(ids) if t == mlm.mask_token_id]
    fills = NaiveInfill(mlm.model, mlm.mask_token_id).fills(ids, masks, [vocab[w] for w in WORDS], "l2r")
    inverse = {i: w for w, i in vocab.items()}
    return [tuple(inverse[t] for t in f[0]) for f in sorted(fills, key=lambda f: f[1], reverse=True)]


def test_bad_rows_become_error_rows_with_reasons(tmp_path, tiny_model_dir):
    corpus = tmp_path / "in.jsonl"
    lines = [
        {"id": "none", "text": "no mask here"},
        {"id": "inside", "text": "un[MASK]able words"},
        {"id": "many", "text": "the " + " ".join(["[MASK]"] * 4)},
        {"id": "answer", "text": "the [MASK] fox", "answer": "two tokens"},
        {"id": "long", "text": "the [MASK] " + "fox " * 200},
        {"id": "null", "text": None},
        {"id": "good", "text": "the [MASK] fox", "answer": "the"},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, summary = run(
        "infill",
        str(corpus),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(tmp_path / "o"),
        "--id-column",
        "id",
        "--max-masks",
        "3",
        "--vocab-restrict",
        " ".join(WORDS),
    )
    assert code == 0 and summary["rows"] == 7 and summary["ok"] == 1 and summary["errors"] == 6
    rows = rows_of(tmp_path / "o")
    assert "no mask token '[MASK]'" in rows["none"]["error"]
    assert "inside a word" in rows["inside"]["error"]
    assert "4 mask tokens, more than --max-masks 3" in rows["many"]["error"]
    assert "the answer has 2 tokens for 1 mask tokens" in rows["answer"]["error"]
    assert "over the model's maximum" in rows["long"]["error"]
    assert rows["null"]["error"] == "text is missing (null)"
    assert rows["good"]["status"] == "ok" and rows["good"]["beams"][0]["text"].startswith("the ")
    assert all(r["beams"] is None for r in rows.values() if r["status"] == "error")


def test_ranks_accuracies_and_bleu_follow_the_answers(tmp_path, tiny_model_dir):
    """Answers chosen from the brute-force ranking: the first row's is the best fill, the second's the
    third best, the third's is no fill of the restricted vocabulary, so top-1 = 1/3 and top-3 = 2/3."""
    model = tiny_model_dir("bert")
    a, b = exact_fills(model, TEXTS["a"]), exact_fills(model, TEXTS["b"])
    records = [
        {"id": "a", "text": TEXTS["a"], "answer": " ".join(a[0])},
        {"id": "b", "text": TEXTS["b"], "answer": " ".join(b[2])},
        {"id": "c", "text": TEXTS["c"], "answer": "zzz zzz"},
    ]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, summary = run(
        "infill",
        str(corpus),
        "--model",
        str(model),
        "--output",
        str(tmp_path / "o"),
        "--id-column",
        "id",
        "--decoder",
        "exact",
        "--top",
        "3",
        "--vocab-restrict",
        " ".join(WORDS),
        "--dtype",
        "float64",
    )
    assert code == 0
    rows = rows_of(tmp_path / "o")
    assert [tuple(beam["tokens"]) for beam in rows["a"]["beams"]] == a[:3]
    assert (rows["a"]["rank"], rows["b"]["rank"], rows["c"]["rank"]) == (1, 3, None)
    assert summary["accuracy"] == pytest.approx({"top1": 1 / 3, "top2": 1 / 3, "top3": 2 / 3})
    b_right = sum(x == y for x, y in zip(b[0], b[2]))
    assert summary["token_accuracy"] == pytest.approx((2 + b_right + 0) / 5)
    assert summary["bleu"]["max_ngram_order"] == 1 and 0 < summary["bleu"]["score"] < 100
    assert "accuracy_hcb" in summary and (tmp_path / "o" / "report.md").read_text().count("|") > 10


def test_filled_text_reads_like_the_input(tmp_path, tiny_model_dir):
    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox, [MASK].\n")
    code, _ = run(
        "infill",
        str(corpus),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(tmp_path / "o"),
        "--vocab-restrict",
        "the rec",
        "--beam",
        "2",
        "--top",
        "2",
    )
    row = next(iter(rows_of(tmp_path / "o").values()))
    for beam in row["beams"]:
        assert beam["text"] == f"the {beam['tokens'][0]} fox, {beam['tokens'][1]}."
    assert row["best"] == row["beams"][0]["text"]


def test_options_and_vocabulary_errors_stop_before_work(tmp_path, tiny_model_dir, capsys):
    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox\n")
    model = str(tiny_model_dir("bert"))
    for extra, message in (
        (["--vocab-restrict", "zzzq"], "not in the model's vocabulary: zzzq"),
        (["--top", "9"], "--top 9 is more than --beam 5"),
        (["--pivot", "zzzq"], "--pivot 'zzzq' is not a token"),
    ):
        code, _ = run("infill", str(corpus), "--model", model, "--output", str(tmp_path / "o"), *extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err[-1].startswith("dscore: error:") and message in err[-1] and "Traceback" not in err[-1]
    assert not (tmp_path / "o").exists()


def test_rescore_pll_gives_each_written_fill_its_pll(tmp_path, tiny_model_dir):
    from distributed_scoring.engine.masking import Sentence
    from distributed_scoring.engine.pll import PLLEngine

    corpus = tmp_path / "in.txt"
    corpus.write_text("the [MASK] fox [MASK] over\n")
    model = tiny_model_dir("bert")
    code, _ = run(
        "infill",
        str(corpus),
        "--model",
        str(model),
        "--output",
        str(tmp_path / "o"),
        "--beam",
        "3",
        "--top",
        "2",
        "--rescore-pll",
        "--vocab-restrict",
        " ".join(WORDS),
    )
    row = next(iter(rows_of(tmp_path / "o").values()))
    mlm = load_masked_lm(ModelSpec(str(model)))
    engine = PLLEngine(mlm)
    for beam, pll in zip(row["beams"], row["pll"]):
        ids = np.array(mlm.tokenizer(beam["text"])["input_ids"])
        s = Sentence(ids, np.arange(1, len(ids) - 1), np.arange(len(ids)))  # every token but [CLS] and [SEP]
        assert pll == pytest.approx(float(engine.token_logprobs([s])[0].sum()), abs=1e-5)


def test_rescore_pll_reports_progress_through_both_passes(tiny_model_dir):
    """The search moves the first half of the shard's progress, the PLL pass over its fills the second."""
    import pyarrow as pa

    from distributed_scoring.workloads.infill import infill_workload

    options = InfillOptions(beam=2, rescore_pll=True, vocab_restrict=WORDS)
    workload = infill_workload(ModelSpec(str(tiny_model_dir("bert"))), options)
    read = pa.table(
        {
            "id": list(TEXTS),
            "text": list(TEXTS.values()),
            "status": ["ok"] * len(TEXTS),
            "error": pa.array([None] * len(TEXTS), pa.string()),
        }
    )  # as the read stage writes them
    prepared = workload.make_preparer()(read)
    reports: list[float] = []
    rows = workload.make_scorer()(prepared, lambda done, total: reports.append(done / total)).to_pylist()
    assert all(r["status"] == "ok" and len(r["pll"]) == 2 for r in rows)
    assert reports == sorted(reports) and reports[-1] == 1.0
    assert any(0 < f < 0.5 for f in reports) and sum(f > 0.5 for f in reports) == len(TEXTS)


@pytest.mark.ray
def test_on_ray_the_rows_equal_in_process_and_a_rerun_resumes(tmp_path, tiny_model_dir, ray_local):
    corpus = tmp_path / "in.txt"
    corpus.write_text("".join(f"{t}\n" for t in TEXTS.values()) * 3)
    model = str(tiny_model_dir("bert"))
    common = ["--model", model, "--decoder", "hcb", "--order", "best-to-worst", "--beam", "3", "--shard-rows", "4"]
    code, local = run("infill", str(corpus), "--output", str(tmp_path / "local"), *common)
    code_ray, on_ray = run("infill", str(corpus), "--output", str(tmp_path / "ray"), "--ray", *common)
    assert code == code_ray == 0 and local["rows"] == on_ray["rows"] == 9
    assert same(rows_of(tmp_path / "local"), rows_of(tmp_path / "ray"))
    code, again = run("infill", str(corpus), "--output", str(tmp_path / "ray"), "--ray", *common)
    assert code == 0 and again["rows"] == 9 and again["examples_per_s"] is None  # nothing left to fill


def test_the_preparer_finds_masks_and_their_spans(tiny_model_dir):
    import pyarrow as pa

    from distributed_scoring.io import schema as S

    preparer = InfillPreparer(ModelSpec(str(tiny_model_dir("roberta"))), InfillOptions())
    table = pa.table({S.ID: ["x"], S.TEXT: ["the <mask> fox <mask>."], S.STATUS: ["ok"], S.ERROR: [None]})
    row = preparer(table).to_pylist()[0]
    assert row["status"] == "ok" and row["spans"] == [[4, 10], [15, 21]]
    assert [row["input_ids"][m] for m in row["masks"]] == [preparer.tokenizer.mask_token_id] * 2


def test_special_tokens_are_never_allowed(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir("bert")))
    allowed = allowed_tokens(tokenizer, len(tokenizer) + 6, None)
    assert not allowed[tokenizer.all_special_ids].any() and not allowed[len(tokenizer) :].any()
    assert allowed.sum() == len(tokenizer) - len(set(tokenizer.all_special_ids))


def test_restricted_words_may_be_given_as_they_read(tiny_model_dir):
    """Byte-level BPE writes a word after a space as `Ġword`: `--vocab-restrict word` finds it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir("roberta")))
    vocab = tokenizer.get_vocab()
    word = next(k[1:] for k in sorted(vocab) if k.startswith("Ġ") and k[1:] not in vocab and len(k) > 3)
    allowed = allowed_tokens(tokenizer, len(tokenizer), (word,))
    assert allowed.sum() == 1 and allowed[vocab["Ġ" + word]]
