"""The sampling workload's options derive from the engine's settings: one list of
settings with one set of defaults and one validation, carried across by field name."""

from __future__ import annotations

from dataclasses import fields

import pytest

from distributed_scoring.engine.sampler_settings import SamplerSettings
from distributed_scoring.errors import UserError
from distributed_scoring.workloads.sample import SampleOptions

ENGINE_ONLY = {"start", "min_target_temperature"}  # settled per row / not an option of the command


def test_every_engine_setting_is_an_option_with_the_engine_default():
    options = {f.name: f.default for f in fields(SampleOptions)}
    for f in fields(SamplerSettings):
        if f.name not in ENGINE_ONLY:
            assert options[f.name] == f.default, f.name


def test_the_settings_carry_every_option_by_name():
    options = SampleOptions(
        "raw", "block-mh", 7, 2, 3, 9, False, 4, 1, 0.5, 2.0, 0.25, 0.8, 2, "random", "auto", None, "answer", 1
    )
    settings = options.settings("warm")
    expected = SamplerSettings(
        sampler="block-mh",
        energy="raw",
        epochs=7,
        burn_in=2,
        block=4,
        block_decay=1,
        proposal_temperature=0.5,
        top_p=0.8,
        target_temperature=2.0,
        anneal=0.25,
        order="random",
        start="warm",
        record_every=2,
        forced_accept=1,
    )
    assert settings == expected


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            dict(sampler="mh", block=2),
            "--sampler mh proposes one position at a time: use --sampler block-mh with --block",
        ),
        (dict(epochs=0), "--epochs 0 is out of bounds: it must be at least 1"),
        (dict(top_p=1.5), "--top-p 1.5 is out of bounds: it must be in (0, 1]"),
        (dict(energy="cold"), "--energy 'cold' is not one of raw, norm"),
    ],
)
def test_one_validation_for_the_engine_and_the_command(bad, message):
    """The engine refuses a bad setting with the line the command prints for its flag."""
    for build in (SamplerSettings, SampleOptions):
        with pytest.raises(UserError) as refused:
            build(**bad)
        assert str(refused.value) == message


def test_the_options_own_fields_are_checked_too():
    with pytest.raises(UserError, match="--start 'cold' is not one of auto, given, random, warm"):
        SampleOptions(start="cold")
    with pytest.raises(UserError, match="--chains 0 is out of bounds"):
        SampleOptions(chains=0)
