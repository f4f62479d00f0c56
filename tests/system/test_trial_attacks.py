"""The adversarial trial's attacks: path traversal and control characters in ids, HTML in the audit
report, a model's own code, symlinks from the output to the input, shell and format strings
(tests/helpers/trial/attacks.py)."""

from __future__ import annotations

import pytest

from helpers.trial import attacks
from helpers.trial.play import params, run_case

pytestmark = pytest.mark.system


@pytest.mark.parametrize("case", params(attacks.CASES))
def test_attack(case, trial):
    result = run_case(case, trial)
    assert result.verdict == "PASS", result.why
