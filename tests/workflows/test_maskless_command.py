"""One pass per sentence from the command line, in this process (no Ray, no training: students are saved
straight from a tiny model): `dscore score --method unmasked`, `--maskless` with `--per-token` and the
out-of-range flag, the student's calibration applied by `score` and `audit --maskless` (an uncalibrated one
warned about), `dscore audit --maskless` saying it is a student's estimate, `dscore rescore --method
unmasked`; the calibration's fit (the corpus PPPL of the rows it is fitted on is the teacher's) and its
cross-fitting; and the distillation data `dscore train maskless` reads from a teacher run (its per-token
targets are the teacher's, mutants on their parent's side of the split), refusals in one line."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.maskless import regressor_for, save_student
from distributed_scoring.engine.model_files import load_tokenizer
from distributed_scoring.io import schema as S
from distributed_scoring.measures import pppl
from distributed_scoring.workflows.train.maskless import _split
from distributed_scoring.workflows.train.maskless_eval import cross_fitted, fit_calibration
from distributed_scoring.workflows.train.maskless_job import StudentOptions
from distributed_scoring.workflows.train.run import TOKEN_TARGETS, TrainOptions
from distributed_scoring.workflows.train.teacher import read_teacher
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import rescoring as H
from helpers import tiny
from helpers.maskless import write_family_corpus
from helpers.reference import unmasked_logprobs


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(*args: str) -> tuple[int, dict | None]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue()) if code == 0 else None


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("dscore: error: "), lines
    return lines[-1]


def make_student(
    mlm, folder: Path, target: str, span: tuple[float, float] = (-50.0, 0.0), calibration: dict | None = None
) -> Path:
    """A student folder as `dscore train maskless` writes it, without the training (and with `calibration`
    as its maskless.json's, if given)."""
    info = {
        "target": target,
        "teacher": "teacher/",
        "range": {"pll_per_token": list(span)},
        "heldout": {"rows": 5, "pearson": 0.9, "rmse": 3.0},
        **({"calibration": calibration} if calibration else {}),
    }
    regressor = None
    if target == "sentence":
        regressor = regressor_for(mlm, mean=-40.0, std=10.0)
        torch.nn.init.normal_(regressor.head.weight, std=0.5)
    save_student(mlm, folder, info, regressor)
    return folder


def test_unmasked_scores_in_the_pll_schema_and_equal_the_reference(tmp_path, tiny_model_dir):
    model = str(tiny_model_dir("roberta"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(tiny.CORPUS[:6]) + "\n")
    code, summary = run(
        "score", str(corpus), "--model", model, "--method", "unmasked", "--per-token", "--output", str(tmp_path / "u")
    )
    assert code == 0 and summary["method"] == summary["variant"] == "unmasked" and summary["ok"] == 6
    code, _ = run("score", str(corpus), "--model", model, "--per-token", "--output", str(tmp_path / "pll"))
    rows, pll_rows = pq.read_table(tmp_path / "u" / "rows"), pq.read_table(tmp_path / "pll" / "rows")
    # The PLL's rows say which texts it scored in windows; one unmasked pass has none (a long text is an error row).
    windowed = pll_rows.schema.get_field_index(S.WINDOWED)
    assert rows.schema.remove_metadata() == pll_rows.schema.remove(windowed).remove_metadata()
    mlm = load_masked_lm(ModelSpec(model))
    for row in rows.to_pylist():
        expected = unmasked_logprobs(mlm.model, mlm.tokenizer, row[S.TEXT])
        np.testing.assert_allclose(row[S.TOKEN_LOGPROBS], expected, rtol=0, atol=1e-5)
        assert row[S.PLL] == pytest.approx(expected.sum(), abs=1e-4) and row[S.VARIANT] == "unmasked"
    assert rows[S.N_TOKENS].to_pylist() == pll_rows[S.N_TOKENS].to_pylist()  # the PLL's scored tokens


def test_a_student_flags_predictions_outside_its_training_range(tmp_path, tiny_model_dir, caplog):
    """The per-token columns of a token student, `out_of_range` per row, and the summary's count and warning."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    wide = make_student(mlm, tmp_path / "wide", "token")
    code, summary = run("score", str(corpus), "--maskless", str(wide), "--per-token", "--output", str(tmp_path / "w"))
    assert code == 0 and summary["out_of_range"] == 0 and summary["target"] == "token"
    rows = pq.read_table(tmp_path / "w" / "rows").to_pylist()
    assert all(r[S.OUT_OF_RANGE] is False and r[S.PLL] <= 0 for r in rows)
    assert all(r[S.PLL] == pytest.approx(sum(r[S.TOKEN_LOGPROBS])) for r in rows)
    per_token = sorted(r[S.PLL] / r[S.N_TOKENS] for r in rows)
    middle = (per_token[3] + per_token[4]) / 2  # a range that leaves the 4 lowest rows out
    narrow = make_student(mlm, tmp_path / "narrow", "token", (middle, 0.0))
    code, summary = run("score", str(corpus), "--maskless", str(narrow), "--output", str(tmp_path / "n"))
    flagged = [r[S.OUT_OF_RANGE] for r in pq.read_table(tmp_path / "n" / "rows").to_pylist()]
    assert code == 0 and summary["out_of_range"] == sum(flagged) == 4
    assert any("4 of 14 rows have a predicted PLL per token outside" in w for w in summary["warnings"])
    assert json.loads((tmp_path / "n" / "summary.json").read_text())["out_of_range"] == 4


def test_score_and_audit_apply_the_students_calibration(tmp_path, tiny_model_dir, caplog):
    """`score --maskless` and `audit --maskless` give the calibrated predictions (each term intercept + slope * t,
    the PLL their sum); the same student without a calibration scores raw, with a warning in the summary."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    raw = make_student(mlm, tmp_path / "raw", "token")
    calibrated = make_student(mlm, tmp_path / "cal", "token", calibration={"intercept": -0.4, "slope": 1.2})
    code, summary = run("score", str(corpus), "--maskless", str(raw), "--per-token", "--output", str(tmp_path / "r"))
    assert code == 0 and summary["calibration"] is None
    assert any("has no calibration" in w for w in summary["warnings"]) and "has no calibration" in caplog.text
    code, summary = run(
        "score", str(corpus), "--maskless", str(calibrated), "--per-token", "--output", str(tmp_path / "c")
    )
    assert code == 0 and summary["calibration"]["slope"] == 1.2 and summary["signature"]["calibration"]["slope"] == 1.2
    assert not any("calibration" in w for w in summary["warnings"])
    raw_rows, rows = (pq.read_table(tmp_path / name / "rows").to_pylist() for name in ("r", "c"))
    for r, c in zip(raw_rows, rows):
        assert c[S.PLL] == pytest.approx(-0.4 * r[S.N_TOKENS] + 1.2 * r[S.PLL], rel=0, abs=1e-6)
        np.testing.assert_allclose(c[S.TOKEN_LOGPROBS], -0.4 + 1.2 * np.asarray(r[S.TOKEN_LOGPROBS]), rtol=0, atol=1e-6)
    tokens = sum(r[S.N_TOKENS] for r in rows)
    assert summary["pppl_token"] == pytest.approx(pppl(sum(r[S.PLL] for r in rows), tokens), rel=1e-9)
    code, _ = run("audit", str(corpus), "--maskless", str(calibrated), "--output", str(tmp_path / "a"))
    audited = {r[S.TEXT]: r[S.PLL] for r in pq.read_table(tmp_path / "a" / "rows").to_pylist()}
    assert code == 0 and all(audited[c[S.TEXT]] == pytest.approx(c[S.PLL], rel=0, abs=1e-6) for c in rows)


def test_the_calibration_gives_the_teachers_corpus_pppl_on_the_rows_it_is_fitted_on():
    """Weighted least squares per token: on its own rows sum(intercept * n + slope * s) is the teacher's sum
    (the corpus PPPL matches whatever the lengths), a per-token affine bias is recovered; where the fit would
    lift terms above 0 the map is the ratio of the sums, which keeps them."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 40, size=200).astype(np.float64)
    student = -tokens * rng.uniform(1.0, 3.0, size=200)  # per token -1 to -3
    teacher = -0.6 * tokens + 1.3 * student + rng.normal(0, 0.3, size=200) * np.sqrt(tokens)
    calibration = fit_calibration(teacher, student, tokens)
    assert calibration.intercept == pytest.approx(-0.6, abs=0.05) and calibration.slope == pytest.approx(1.3, abs=0.03)
    assert calibration.pll(student, tokens).sum() == pytest.approx(teacher.sum(), rel=1e-12)
    raw, teachers = pppl(student.sum(), int(tokens.sum())), pppl(teacher.sum(), int(tokens.sum()))
    assert raw / teachers - 1 < -0.5  # the student's bias: far too confident
    lifted = 0.8 * tokens + 1.5 * student  # the least-squares intercept would be +0.8 per token
    ratio = fit_calibration(lifted, student, tokens)
    assert ratio.intercept == 0 and ratio.slope == pytest.approx(lifted.sum() / student.sum())
    assert ratio.pll(student, tokens).sum() == pytest.approx(lifted.sum(), rel=1e-12)
    one_row = fit_calibration(teacher[:1], student[:1], tokens[:1])  # no spread to fit a slope on: the ratio
    assert one_row.pll(student[:1], tokens[:1]) == pytest.approx(teacher[0], rel=1e-12)
    assert fit_calibration(teacher, np.zeros(200), tokens) is None


def test_cross_fitting_calibrates_each_half_by_the_map_fitted_on_the_other():
    """Two families: each is calibrated by the map fitted on the other alone (a family never on both sides);
    one family cannot be cross-fitted."""
    ids = ["a", "a~m1", "a~m2", "b", "b~m1"]
    tokens = np.array([4.0, 5.0, 9.0, 6.0, 7.0])
    teacher = np.array([-10.0, -12.0, -25.0, -15.0, -19.0])
    plls = [-8.0, -9.0, -20.0, -10.0, -13.0]
    student = {"pll": plls, "tokens": [[p / n] * int(n) for p, n in zip(plls, tokens)]}
    heldout = pa.table({S.ID: ids, S.PLL: teacher, S.TARGETS: [list(range(int(n))) for n in tokens]})
    got = cross_fitted(heldout, student, "~", seed=0)
    predicted = np.asarray(student["pll"])
    for family, other in ((slice(0, 3), slice(3, 5)), (slice(3, 5), slice(0, 3))):
        expected = fit_calibration(teacher[other], predicted[other], tokens[other])
        np.testing.assert_allclose(got["pll"][family], expected.pll(predicted[family], tokens[family]), rtol=1e-12)
        for terms, raw in zip(got["tokens"][family], student["tokens"][family]):
            np.testing.assert_allclose(terms, expected.terms(np.asarray(raw)), rtol=1e-12)
    assert cross_fitted(heldout, student, None, seed=0) is not None  # five families without the separator
    assert cross_fitted(heldout.slice(0, 3), {"pll": student["pll"][:3], "tokens": None}, "~", seed=0) is None


def test_audit_with_a_student_says_it_is_an_estimate(tmp_path, tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    student = make_student(mlm, tmp_path / "student", "sentence")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    code, printed = run("audit", str(corpus), "--maskless", str(student), "--output", str(tmp_path / "a"))
    assert code == 0 and printed["estimate"]["scorer"] == "maskless student"
    audit = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert audit["estimate"]["heldout"]["rmse"] == 3.0 and "estimate of its teacher's PLL" in audit["estimate"]["note"]
    assert "Estimate: scored by a maskless student" in (tmp_path / "a" / "report.html").read_text()
    code, printed = run("audit", str(corpus), "--model", str(tiny_model_dir("bert")), "--output", str(tmp_path / "p"))
    assert code == 0 and "estimate" not in printed
    assert "estimate" not in json.loads((tmp_path / "p" / "audit.json").read_text())


def test_rescoring_with_the_unmasked_masked_lm(tmp_path, tiny_model_dir):
    paths = {}
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(4, 3, seed=seed, prefix=split[0])
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in records))
    code, printed = run(
        "rescore",
        "--dev",
        str(paths["dev"]),
        "--test",
        str(paths["test"]),
        "--model",
        str(tiny_model_dir("bert")),
        "--method",
        "unmasked",
        "--output",
        str(tmp_path / "r"),
    )
    assert code == 0 and {"baseline", "rescored", "oracle"} <= set(printed["test"])
    assert set(pq.read_table(tmp_path / "r" / "unmasked" / "rows")[S.VARIANT].to_pylist()) == {"unmasked"}
    assert not (tmp_path / "r" / "mlm").exists()


def test_one_pass_options_that_do_not_go_together_are_refused(tmp_path, tiny_model_dir, capsys):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    sentence = make_student(mlm, tmp_path / "sentence", "sentence")
    corpus = tmp_path / "c.txt"
    corpus.write_text("a sentence\n")
    model = str(tiny_model_dir("bert"))
    for args, message in [
        (["--maskless", str(sentence), "--per-token"], "is a `sentence` student"),
        (["--maskless", str(sentence), "--method", "unmasked"], "does not go with --method unmasked"),
        (["--model", model, "--method", "unmasked", "--order", "r2l"], "belong to --method chain"),
        (["--model", model, "--conditionals", "5"], "add --per-token"),
        (["--model", model, "--method", "unmasked", "--per-token", "--conditionals", "5"], "goes with --method pll"),
        (["--model", model, "--per-token", "--conditionals", "-1"], "--conditionals -1 is out of bounds"),
        (["--model", model, "--method", "unmasked", "--variant", "word_l2r"], "masks nothing"),
    ]:
        code, _ = run("score", str(corpus), "--output", str(tmp_path / "out"), *args)
        assert code == 2 and message in error_line(capsys), args
    assert not (tmp_path / "out").exists()


def test_the_per_token_targets_are_the_teachers_and_mutants_stay_with_their_parent(tmp_path, tiny_model_dir):
    """data/train.parquet's per-token targets and conditionals, read back by id, are the teacher run's own
    per-token scores; with --parent-separator every family falls on one side of the split."""
    model = str(tiny_model_dir("bert"))
    corpus = write_family_corpus(tmp_path / "c.jsonl", parents=20)
    code, _ = run(
        "score",
        str(corpus),
        "--id-column",
        "id",
        "--model",
        model,
        "--per-token",
        "--conditionals",
        "4",
        "--output",
        str(tmp_path / "teacher"),
    )
    assert code == 0
    teacher = read_teacher(str(tmp_path / "teacher"))
    tokenizer, longest = load_tokenizer(ModelSpec(model))
    train, heldout, _ = _split(
        teacher, PLLPreparer(tokenizer, longest), TrainOptions(heldout=0.3), StudentOptions("distribution", "~")
    )
    scored = {r[S.ID]: r for r in pq.read_table(tmp_path / "teacher" / "rows").to_pylist()}
    assert train.num_rows + heldout.num_rows == len(scored) == 60 and heldout.num_rows >= 6
    for row in train.to_pylist():
        assert row[TOKEN_TARGETS] == scored[row[S.ID]][S.TOKEN_LOGPROBS]
        assert sum(row[TOKEN_TARGETS]) == pytest.approx(scored[row[S.ID]][S.PLL], abs=1e-9)
        for name in (S.COND_IDS, S.COND_LOGPROBS, S.COND_REST):
            assert row[name] == scored[row[S.ID]][name], name
    sides = {}
    for side, table in (("train", train), ("heldout", heldout)):
        for row_id in table[S.ID].to_pylist():
            sides.setdefault(row_id.split("~")[0], set()).add(side)
    assert all(len(s) == 1 for s in sides.values()) and len(sides) == 20


def test_teachers_without_what_a_target_needs_and_other_tokenizers_are_refused(tmp_path, tiny_model_dir, capsys):
    model = str(tiny_model_dir("bert"))
    corpus = write_family_corpus(tmp_path / "c.jsonl", parents=4)
    code, _ = run("score", str(corpus), "--id-column", "id", "--model", model, "--output", str(tmp_path / "plain"))
    assert code == 0
    code, _ = run(
        "score", str(corpus), "--id-column", "id", "--model", model, "--per-token", "--output", str(tmp_path / "tokens")
    )
    assert code == 0
    out = tmp_path / "student"
    for teacher, args, message in [
        ("plain", ["--target", "token"], "score it with `dscore score --per-token`"),
        ("tokens", ["--target", "distribution"], "--conditionals K"),
        (
            "tokens",
            ["--target", "token", "--model", str(tiny_model_dir("roberta"))],
            "must use its teacher's tokenizer",
        ),
        ("plain", ["--target", "sentence", "--nbest-dev", str(corpus)], "go together"),
        ("plain", ["--target", "sentence", "--freeze-layers", "-1"], "--freeze-layers"),
    ]:
        code, _ = run(
            "train", "maskless", "--teacher", str(tmp_path / teacher), "--model", model, "--output", str(out), *args
        )
        assert code == 2 and message in error_line(capsys), args
        assert not out.exists()
