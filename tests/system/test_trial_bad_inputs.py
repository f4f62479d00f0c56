"""The adversarial trial's bad inputs: every file of tests/data/bad, empty and odd inputs, flags out of
bounds, repeated ids, broken N-best lists; each a one-line refusal or an error row per bad row
(tests/helpers/trial/bad_inputs.py)."""

from __future__ import annotations

import pytest

from helpers.trial import bad_inputs
from helpers.trial.play import params, run_case

pytestmark = pytest.mark.system


@pytest.mark.parametrize("case", params(bad_inputs.CASES))
def test_bad_input(case, trial):
    result = run_case(case, trial)
    assert result.verdict == "PASS", result.why
