"""`dscore train` end to end: bad teachers and corpora refused in one line before any work; on the local Ray,
a tiny model trained a few steps (the loss falls, checkpoints and metrics.jsonl written, the report's
student/calibrated/unmasked/length-only table, mutant pairs and rescoring, the calibration fitted on the
held-out rows and stored, its cross-fitted corpus PPPL closer to the teacher's than the raw student's, the
folder loads with `dscore score --maskless` (calibrated) / `--model`, the student's rows in the teacher's
schema, rescoring with it), for the default `distribution` target and the paper's `sentence` target."""

from __future__ import annotations

import io
import json
import random
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.io import schema as S

from helpers import rescoring as H
from helpers import tiny
from helpers.maskless import write_family_corpus

# One local-Ray worker of one CPU: a second torch thread on a shared 2-core machine only waits.
FAST = ["--cpus-per-worker", "1", "--batch-size", "8", "--lr", "1e-3"]


def run(*args: str) -> tuple[int, dict | None]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue()) if code == 0 else None


def write_corpus(path: Path, n: int, seed: int = 0) -> Path:
    """`n` short sentences of tiny-corpus words, lengths 3 to 14 words (PLLs spread by length)."""
    rng = random.Random(seed)
    words = " ".join(tiny.CORPUS).split()
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "\n" for _ in range(n)))
    return path


def error_line(capsys) -> str:
    """The CLI's one-line error (stderr may hold log lines before it)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("dscore: error: "), lines
    return lines[-1]


def test_bad_teacher_folders_are_refused_in_one_line(tmp_path, tiny_model_dir, capsys):
    model, out = str(tiny_model_dir("bert")), tmp_path / "out"
    ok_rows = {S.ID: ["a", "b"], S.TEXT: ["x y", "y z"], S.STATUS: ["ok", "ok"], S.N_TOKENS: [2, 2]}
    cases = {
        "missing": (None, "does not exist"),
        "empty": ({}, "holds no scored rows"),
        "no pll": ({"rows/part-0.parquet": pa.table(ok_rows)}, "have no pll column(s)"),
        "all errors": (
            {
                "rows/part-0.parquet": pa.table(
                    {**ok_rows, S.PLL: pa.array([None, None], pa.float64()), S.STATUS: ["error", "error"]}
                )
            },
            "are error rows",
        ),
        "another workload": (
            {"rows/part-0.parquet": pa.table({**ok_rows, S.PLL: [-1.0, -2.0]}), "_run.json": {"workload": "causal"}},
            "must be a PLL run",
        ),
    }
    for name, (files, message) in cases.items():
        teacher = tmp_path / name
        if files is not None:
            teacher.mkdir()
        for relative, content in (files or {}).items():
            (teacher / relative).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, dict):
                (teacher / relative).write_text(json.dumps(content))
            else:
                pq.write_table(content, teacher / relative)
        code, _ = run("train", "maskless", "--teacher", str(teacher), "--model", model, "--output", str(out))
        assert code == 2, name
        assert message in error_line(capsys), name
        assert not out.exists(), f"{name}: the output folder was touched before the refusal"


def test_bad_training_options_and_corpora_are_refused_in_one_line(tmp_path, tiny_model_dir, capsys):
    model, out = str(tiny_model_dir("bert")), tmp_path / "out"
    corpus = write_corpus(tmp_path / "c.txt", 30)
    for args, message in [
        (["--data", str(corpus), "--heldout", "1.5"], "--heldout"),
        (["--data", str(corpus), "--batch-size", "64"], "do not fill one batch"),
        (["--data", str(tmp_path / "none.txt")], "none.txt"),
        (["--data", str(corpus), "--orders", "0"], "--orders"),
    ]:
        code, _ = run("train", "pmlm", "--model", model, "--output", str(out), *args)
        assert code == 2, args
        assert message in error_line(capsys), args
        assert not out.exists()


def test_score_takes_either_a_model_or_a_student_folder(tmp_path, tiny_model_dir, capsys):
    corpus, model = write_corpus(tmp_path / "c.txt", 3), str(tiny_model_dir("bert"))
    for args, message in [
        (["--model", model, "--maskless", model], "either --model"),
        ([], "either --model"),
        (["--maskless", model], "not a maskless scorer folder"),
        (["--maskless", model, "--method", "chain"], "does not go with --method chain"),
    ]:
        code, _ = run("score", str(corpus), "--output", str(tmp_path / "out"), *args)
        assert code == 2 and message in error_line(capsys), args
    assert not (tmp_path / "out").exists()


def write_nbest(folder: Path) -> dict[str, Path]:
    paths = {}
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(4, 3, seed=seed, prefix=split[0])
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in records))
    return paths


@pytest.fixture(scope="module")
def student(ray_local, tiny_model_dir, tmp_path_factory):
    """A teacher (per-token terms and whole conditionals) scored in process, a `distribution` student trained on
    it on the local Ray with N-best rescoring: (corpus, teacher, student, report)."""
    folder = tmp_path_factory.mktemp("maskless")
    corpus = write_family_corpus(folder / "corpus.jsonl", parents=16)
    model = str(tiny_model_dir("bert"))
    code, _ = run(
        "score",
        str(corpus),
        "--id-column",
        "id",
        "--model",
        model,
        "--per-token",
        "--conditionals",
        "1000",
        "--output",
        str(folder / "teacher"),
    )
    assert code == 0
    nbest = write_nbest(folder)
    code, report = run(
        "train",
        "maskless",
        "--teacher",
        str(folder / "teacher"),
        "--model",
        model,
        "--output",
        str(folder / "student"),
        "--steps",
        "24",
        "--checkpoint-every",
        "10",
        "--heldout",
        "0.25",
        "--parent-separator",
        "~",
        "--nbest-dev",
        str(nbest["dev"]),
        "--nbest-test",
        str(nbest["test"]),
        *FAST,
    )
    assert code == 0
    return corpus, folder / "teacher", folder / "student", report


@pytest.mark.ray
def test_a_maskless_student_trains_reports_and_checkpoints(student):
    _, _, out, report = student
    assert json.loads((out / "report.json").read_text()) == report
    assert report["target"] == "distribution" and (out / "report.md").read_text().startswith("# Maskless student")
    assert report["rows"]["train"] + report["rows"]["heldout"] == report["rows"]["usable"] == 48
    assert report["training"]["steps"] == 24
    assert report["training"]["loss_last"] < report["training"]["loss_first"]
    heldout = report["heldout"]
    assert heldout["rows"] == report["rows"]["heldout"] >= 3 and heldout["mutant_pairs"] == 2 * heldout["rows"] / 3
    for scorer in ("student", "unmasked", "length_baseline"):
        figures = heldout[scorer]
        assert -1 <= figures["pearson"] <= 1 and figures["rmse"] > 0 and figures["above_zero"] == 0, scorer
    for scorer in ("student", "unmasked"):
        assert heldout[scorer]["token_terms"]["tokens"] > heldout["rows"]
        assert heldout[scorer]["mutant_minus_parent"]["pairs"] == heldout["mutant_pairs"]
    assert set(report["rescoring"]) >= {"teacher", "student", "unmasked"}
    for who in ("teacher", "student", "unmasked"):
        assert {"baseline", "rescored", "oracle"} <= set(report["rescoring"][who]["test"])
        assert (out / "rescore" / who / "report.json").exists()
    assert report["speed"]["student_sentences_per_s"] > 0 and report["speed"]["pll_sentences_per_s"] > 0
    assert report["speed"]["speedup"] == pytest.approx(
        report["speed"]["student_sentences_per_s"] / report["speed"]["pll_sentences_per_s"]
    )
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 25))
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-00000020", "step-00000024"]
    predictions = pq.read_table(out / "heldout_predictions.parquet")
    assert predictions.num_rows == heldout["rows"]
    assert predictions.column_names == [
        S.ID,
        S.PLL,
        "predicted",
        "calibrated",
        "unmasked",
        "predicted_token_logprobs",
        "calibrated_token_logprobs",
        "unmasked_token_logprobs",
    ]
    info = json.loads((out / "maskless.json").read_text())
    assert info["target"] == "distribution" and info["format"] == 3
    assert info["heldout"]["scorer"] == "calibrated" and info["heldout"]["pearson"] == heldout["calibrated"]["pearson"]
    low, high = info["range"]["pll_per_token"]
    assert low < high < 0


@pytest.mark.ray
def test_the_student_is_calibrated_on_its_heldout_rows(student):
    """The map fitted on every held-out row is stored; on those rows it gives the teacher's corpus PPPL
    exactly, and cross-fitted (each half calibrated by the other's map) it comes closer than the raw student."""
    _, _, out, report = student
    calibration = json.loads((out / "maskless.json").read_text())["calibration"]
    assert calibration == report["calibration"] and calibration["rows"] == report["heldout"]["rows"]
    assert calibration["intercept"] <= 0 < calibration["slope"]
    predictions = pq.read_table(out / "heldout_predictions.parquet").to_pylist()
    tokens = [len(r["predicted_token_logprobs"]) for r in predictions]
    fitted = sum(
        calibration["intercept"] * n + calibration["slope"] * r["predicted"] for n, r in zip(tokens, predictions)
    )
    assert fitted == pytest.approx(sum(r[S.PLL] for r in predictions), rel=1e-9)
    corpus = report["heldout"]["corpus_pppl"]
    assert corpus["tokens"] == calibration["tokens"] == sum(tokens) and "cross-fitting" in corpus["calibrated_by"]
    for who in ("student", "calibrated", "unmasked"):
        assert corpus["gap"][who] == pytest.approx(corpus[who] / corpus["teacher"] - 1)
    assert abs(corpus["gap"]["calibrated"]) < abs(corpus["gap"]["student"]), corpus
    assert "Corpus PPPL of the held-out rows" in (out / "report.md").read_text()


@pytest.mark.ray
def test_a_sentence_student_trains_and_predicts_below_zero(ray_local, tiny_model_dir, tmp_path):
    """The paper's target: a head over the first token; no per-token columns, every prediction below 0."""
    corpus, model = write_corpus(tmp_path / "c.txt", 30), str(tiny_model_dir("bert"))
    assert run("score", str(corpus), "--model", model, "--output", str(tmp_path / "teacher"))[0] == 0
    code, report = run(
        "train",
        "maskless",
        "--teacher",
        str(tmp_path / "teacher"),
        "--model",
        model,
        "--output",
        str(tmp_path / "student"),
        "--target",
        "sentence",
        "--steps",
        "8",
        "--heldout",
        "0.2",
        *FAST,
    )
    assert code == 0 and report["target"] == "sentence" and "token_terms" not in report["heldout"]["student"]
    assert report["heldout"]["student"]["above_zero"] == 0 and report["rescoring"] is None
    code, summary = run("score", str(corpus), "--maskless", str(tmp_path / "student"), "--output", str(tmp_path / "s"))
    rows = pq.read_table(tmp_path / "s" / "rows")
    assert code == 0 and summary["target"] == "sentence" and max(rows[S.PLL].to_pylist()) < 0
    assert S.TOKEN_LOGPROBS not in rows.column_names


@pytest.mark.ray
def test_the_student_scores_in_the_teachers_schema_and_loads_as_a_masked_lm(student, tmp_path):
    corpus, teacher, out, _ = student
    code, summary = run(
        "score",
        str(corpus),
        "--id-column",
        "id",
        "--maskless",
        str(out),
        "--per-token",
        "--output",
        str(tmp_path / "s"),
    )
    assert code == 0 and summary["rows"] == summary["ok"] == 48 and summary["variant"] == "maskless"
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["variant"] == "maskless"
    rows, teacher_rows = pq.read_table(tmp_path / "s" / "rows"), pq.read_table(teacher / "rows")
    # The student reads a sentence in one pass and never windows: its rows have no `windowed` column.
    pll_columns = [c for c in teacher_rows.column_names if not c.startswith("cond_") and c != S.WINDOWED]
    assert (
        rows.select(pll_columns).schema.remove_metadata() == teacher_rows.select(pll_columns).schema.remove_metadata()
    )
    assert rows.column_names == pll_columns[:12] + [S.OUT_OF_RANGE] + pll_columns[12:]
    assert set(rows[S.VARIANT].to_pylist()) == {"maskless"}
    assert rows[S.N_TOKENS].to_pylist() == teacher_rows[S.N_TOKENS].to_pylist()  # the tokens a PLL would score
    assert rows[S.TOKENS].to_pylist() == teacher_rows[S.TOKENS].to_pylist()
    assert max(rows[S.PLL].to_pylist()) < 0
    calibration = json.loads((out / "maskless.json").read_text())["calibration"]
    assert summary["calibration"] == calibration and not any("calibration" in w for w in summary["warnings"])
    scored = {r[S.ID]: r[S.PLL] for r in rows.to_pylist()}
    for r in pq.read_table(out / "heldout_predictions.parquet").to_pylist():  # the raw predictions, mapped
        mapped = calibration["intercept"] * len(r["predicted_token_logprobs"]) + calibration["slope"] * r["predicted"]
        assert scored[r[S.ID]] == pytest.approx(mapped, rel=0, abs=1e-4)
    code, summary = run("score", str(corpus), "--id-column", "id", "--model", str(out), "--output", str(tmp_path / "m"))
    assert code == 0 and summary["ok"] == 48


@pytest.mark.ray
def test_rescoring_with_the_student_instead_of_the_masked_lm(student, tmp_path):
    _, _, out, _ = student
    paths = write_nbest(tmp_path)
    code, printed = run(
        "rescore",
        "--dev",
        str(paths["dev"]),
        "--test",
        str(paths["test"]),
        "--maskless",
        str(out),
        "--output",
        str(tmp_path / "r"),
    )
    assert code == 0 and {"baseline", "rescored", "oracle"} <= set(printed["test"])
    assert set(pq.read_table(tmp_path / "r" / "maskless" / "rows")[S.VARIANT].to_pylist()) == {"maskless"}
    assert not (tmp_path / "r" / "mlm").exists()


@pytest.mark.ray
def test_another_command_in_a_training_folder_is_refused_unless_overwritten(student, tiny_model_dir, capsys):
    _, teacher, out, _ = student
    args = [
        "train",
        "maskless",
        "--teacher",
        str(teacher),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(out),
        "--steps",
        "25",
        "--checkpoint-every",
        "10",
        "--heldout",
        "0.25",
        "--parent-separator",
        "~",
        "--nbest-dev",
        str(teacher.parent / "dev.jsonl"),
        "--nbest-test",
        str(teacher.parent / "test.jsonl"),
        *FAST,
    ]
    code, _ = run(*args)
    assert code == 2 and "holds results of a different run (it differs in: steps)" in error_line(capsys)
    code, _ = run("score", str(teacher / "rows"), "--model", str(tiny_model_dir("bert")), "--output", str(out))
    assert code == 2 and "different run" in error_line(capsys)
    for command in (
        [*args[:4], "--model", str(out), "--output", str(out), *args[8:]],
        ["score", str(teacher / "rows"), "--model", str(out), "--output", str(out), "--overwrite"],
    ):
        code, _ = run(*command)  # the student's own folder as the model: --overwrite would delete it
        assert code == 2 and "is the model's folder" in error_line(capsys)
    assert not (out / "rows").exists() and not (out / "_done").exists()  # refused before it wrote anything


@pytest.mark.ray
def test_pmlm_trains_and_reports_random_order_perplexity_before_and_after(ray_local, tiny_model_dir, tmp_path):
    corpus, out = write_corpus(tmp_path / "c.txt", 40), tmp_path / "pmlm"
    code, report = run(
        "train",
        "pmlm",
        "--model",
        str(tiny_model_dir("bert")),
        "--data",
        str(corpus),
        "--output",
        str(out),
        "--steps",
        "16",
        "--orders",
        "2",
        "--heldout",
        "0.2",
        *FAST,
    )
    assert code == 0
    before, after = report["heldout"]["before"], report["heldout"]["after"]
    for figures in (before, after):
        assert figures["sentences"] == report["rows"]["heldout"] and len(figures["ppl_random_each_order"]) == 2
        assert figures["ppl_l2r"] > 1 and figures["ppl_random"] > 1
    assert after["ppl_random"] < before["ppl_random"]  # a random tiny model: much to gain from any training
    assert report["training"]["loss_last"] < report["training"]["loss_first"]
    code, summary = run("score", str(corpus), "--model", str(out), "--output", str(tmp_path / "s"))
    assert code == 0 and summary["ok"] == 40
