"""The adversarial trial's operator mistakes: two runs into one folder, an `--output` that is an input
or empty, a folder of the user's own files, a copied shard, `--overwrite` over another command's run; each
refused in one line or survived with nothing mixed (tests/helpers/trial/mistakes.py)."""

from __future__ import annotations

import pytest

from helpers.trial import mistakes
from helpers.trial.play import params, run_case

pytestmark = pytest.mark.system


@pytest.mark.parametrize("case", params(mistakes.CASES))
def test_operator_mistake(case, trial):
    result = run_case(case, trial)
    assert result.verdict == "PASS", result.why
