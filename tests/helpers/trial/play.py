"""Playing the adversarial trial's cases: every category's, in the table's order; one case in a fresh folder
of its own, its outcome and time; and the cases as pytest parameters for the system tests (tests/system)."""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest

from helpers.trial import attacks, bad_inputs, faults, mistakes, stops
from helpers.trial.cases import Case
from helpers.trial.dscore import Dscore
from helpers.trial.judge import Outcome, Trial

CASES: list[Case] = [*bad_inputs.CASES, *faults.CASES, *mistakes.CASES, *attacks.CASES, *stops.CASES]


@dataclass
class Result:
    id: str
    category: str
    what: str
    expected: str
    outcome: Outcome
    seconds: float

    @property
    def verdict(self) -> str:
        return "PASS" if self.outcome.passed else "FAIL"

    @property
    def why(self) -> str:
        """A failed case's problems, with the command judged and what it said."""
        o = self.outcome
        return f"{self.id} ({self.what}): {'; '.join(o.problems)}; `{o.command}` exit {o.rc}: {o.line or '-'}"


def run_case(c: Case, trial: Trial) -> Result:
    d = trial.root / c.id
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    started = time.monotonic()
    try:
        outcome = c.run(trial, d)
    except Exception as exc:  # the trial's own failure: reported as the case's, never hidden
        outcome = Outcome(problems=[f"the trial itself failed: {type(exc).__name__}: {exc}"])
        traceback.print_exc()
    return Result(c.id, c.category, c.what, c.expected, outcome, time.monotonic() - started)


def select(ids: Sequence[str], ray: bool) -> list[Case]:
    cases = [c for c in CASES if (not ids or any(c.id.startswith(i) for i in ids)) and (ray or not c.ray)]
    assert len({c.id for c in CASES}) == len(CASES), "case ids repeat"
    return cases


def run_trial(root: Path, cases: Sequence[Case], mode: str = "fork") -> list[Result]:
    trial = Trial(root, Dscore(mode))
    root.mkdir(parents=True, exist_ok=True)
    trial.warm()
    results = []
    for n, c in enumerate(cases, start=1):
        result = run_case(c, trial)
        results.append(result)
        o = result.outcome
        print(
            f"[{n:3d}/{len(cases)}] {c.id} {result.verdict} {result.seconds:5.1f} s  {c.what}"
            + (f"\n      {'; '.join(o.problems)}" if o.problems else ""),
            flush=True,
        )
    return results


def params(cases: Sequence[Case]) -> list:
    """The cases as pytest parameters, by id; the ones that start an embedded Ray marked `ray`."""
    return [pytest.param(c, id=c.id, marks=[pytest.mark.ray] if c.ray else []) for c in cases]
