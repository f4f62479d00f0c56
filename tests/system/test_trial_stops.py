"""The adversarial trial's stops and checks: SIGTERM and Ctrl-C mid-run, models that cannot be masked
LMs, a folder name too long, a low open-files limit (tests/helpers/trial/stops.py)."""

from __future__ import annotations

import pytest

from helpers.trial import stops
from helpers.trial.play import params, run_case

pytestmark = pytest.mark.system


@pytest.mark.parametrize("case", params(stops.CASES))
def test_stop_and_check(case, trial):
    result = run_case(case, trial)
    assert result.verdict == "PASS", result.why
