"""The adversarial trial's own machinery (tests/helpers/trial): a few of its cases run in this process (a
refusal, error rows, a damaged folder rerun, an empty --output) and its table holds what they saw; a
broken promise is a FAIL with its reason. Quick, so that the trial cannot rot between its full runs."""

from __future__ import annotations

import shutil

import pytest

from helpers.trial.cases import M
from helpers.trial.dscore import Dscore
from helpers.trial.judge import Trial
from helpers.trial.play import run_case, select
from helpers.trial.report import markdown_table

CASES = ("B01", "B24", "F11", "O08")  # binary.dat refused, a null text's error row, a deleted marker, --output ''


@pytest.fixture
def inline_trial(tmp_path, tiny_model_dir) -> Trial:
    (tmp_path / "_models").mkdir()
    shutil.copytree(tiny_model_dir("bert"), tmp_path / "_models" / "bert")
    return Trial(tmp_path, Dscore("inline"))


def test_the_cases_run_in_process_and_pass(inline_trial):
    cases = select(CASES, ray=False)
    assert [c.id for c in cases] == list(CASES)
    results = [run_case(c, inline_trial) for c in cases]
    assert [(r.id, r.outcome.problems) for r in results] == [(c, []) for c in CASES]
    refused, rows, fault, empty = (r.outcome for r in results)
    assert refused.rc == 2 and "binary.dat is not a text file" in refused.line and not refused.traceback
    assert (rows.rc, rows.rows_in, rows.rows_out, rows.duplicates, rows.verdict) == (0, 3, 3, 0, "OK")
    assert fault.done.endswith(("verify before the rerun: INCOMPLETE", "verify before the rerun: FAILED"))
    assert fault.verdict == "OK" and fault.rows_out == fault.rows_in
    assert empty.rc == 2 and "--output is empty" in empty.line
    table = markdown_table(results)
    assert table.count("\n") == 2 + len(CASES) and "| B24 | bad input |" in table
    assert table.count("| PASS |") == len(CASES)


def test_a_broken_promise_is_a_fail_with_its_reason(inline_trial, tmp_path):
    """A case that sees something else than it expects fails, naming what it saw."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "c.txt").write_text("a dog\n")
    o = inline_trial.refused(tmp_path / "x", ["score", "c.txt", "--model", M, "--output", "out"], ["never said"])
    assert o.rc == 0 and not o.passed
    assert "exit 0, expected 2" in o.problems and "the line lacks 'never said'" in o.problems
    assert "out/ was created" in o.problems
