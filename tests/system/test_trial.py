"""benchmarks/adversarial.py: a few of the trial's cases, run through its own functions in this process, so
that the script cannot rot (a refusal, error rows, a damaged folder rerun, an empty --output) and its
report holds what it saw."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import adversarial as A  # noqa: E402

CASES = ("B01", "B24", "F11", "O08")  # binary.dat refused, a null text's error row, a deleted marker, --output ''


@pytest.fixture
def trial(tmp_path, tiny_model_dir) -> A.Trial:
    (tmp_path / "_models").mkdir()
    shutil.copytree(tiny_model_dir("bert"), tmp_path / "_models" / "bert")
    return A.Trial(tmp_path, A.Dscore("inline"))


def test_the_cases_run_in_process_and_pass(trial):
    cases = A.select(CASES, ray=False)
    assert [c.id for c in cases] == list(CASES)
    results = [A.run_case(c, trial) for c in cases]
    assert [(r.id, r.outcome.problems) for r in results] == [(c, []) for c in CASES]
    refused, rows, fault, empty = (r.outcome for r in results)
    assert refused.rc == 2 and "binary.dat is not a text file" in refused.line and not refused.traceback
    assert (rows.rc, rows.rows_in, rows.rows_out, rows.duplicates, rows.verdict) == (0, 3, 3, 0, "OK")
    assert fault.done.endswith(("verify before the rerun: INCOMPLETE", "verify before the rerun: FAILED"))
    assert fault.verdict == "OK" and fault.rows_out == fault.rows_in
    assert empty.rc == 2 and "--output is empty" in empty.line
    table = A.markdown_table(results)
    assert table.count("\n") == 2 + len(CASES) and "| B24 | bad input |" in table
    assert table.count("| PASS |") == len(CASES)


def test_a_broken_promise_is_a_fail_with_its_reason(trial, tmp_path):
    """A case that sees something else than it expects fails, naming what it saw."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "c.txt").write_text("a dog\n")
    o = trial.refused(tmp_path / "x", ["score", "c.txt", "--model", A.M, "--output", "out"], ["never said"])
    assert o.rc == 0 and not o.passed
    assert "exit 0, expected 2" in o.problems and "the line lacks 'never said'" in o.problems
    assert "out/ was created" in o.problems
