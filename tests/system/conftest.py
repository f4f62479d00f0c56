"""The system tests: the adversarial trial's cases (tests/helpers/trial) against the real CLI, one file per
category, each case a test that asserts its verdict is PASS. Marked `system`; `make test` runs them (35 s for the
135 cases without Ray, 2.5 min for the 7 that start an embedded Ray, on 2 cores).
tests/system/trial.py plays the same cases and writes docs/reliability.md."""

from __future__ import annotations

import pytest

from helpers.trial.dscore import Dscore, set_environment
from helpers.trial.judge import Trial

set_environment()


@pytest.fixture(scope="session")
def trials(tmp_path_factory):
    """mode -> the session's trial whose commands run that way (per pytest worker), in one folder: the tiny
    models built and what every command imports imported once, before the first command is forked."""
    root, made = tmp_path_factory.mktemp("trial"), {}

    def get(mode: str) -> Trial:
        if mode not in made:
            made[mode] = Trial(root, Dscore(mode))
            made[mode].warm()
        return made[mode]

    return get


@pytest.fixture
def trial(request, trials) -> Trial:
    """Commands forked from this process; for a case marked `ray`, every command spawned: the `ray` tests
    run in a session that may hold a Ray of its own (`ray_local`), which a forked child must not inherit."""
    return trials("spawn" if request.node.get_closest_marker("ray") else "fork")
