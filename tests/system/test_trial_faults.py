"""The adversarial trial's faults: kill -9 mid-run, damaged folders, changed inputs, locks, a full disk;
each survived by rerunning the same command (rows in == rows out, no repeated id, verify OK)
(tests/helpers/trial/faults.py)."""

from __future__ import annotations

import pytest

from helpers.trial import faults
from helpers.trial.play import params, run_case

pytestmark = pytest.mark.system


@pytest.mark.parametrize("case", params(faults.CASES))
def test_fault(case, trial):
    result = run_case(case, trial)
    assert result.verdict == "PASS", result.why
