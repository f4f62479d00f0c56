"""Options declared once (`distributed_scoring.options`): the CLI's flags are derived from the options classes
and read back into them, the classes check themselves from the same declaration, and what a run's
fingerprint records of them is what it recorded before they were declared this way (so old folders resume)."""

from __future__ import annotations

import dataclasses

import pytest

from distributed_scoring.cli import build_parser
from distributed_scoring.cli.common import options_from
from distributed_scoring.config import RayOptions, ScoringOptions
from distributed_scoring.engine.infill_settings import InfillSettings
from distributed_scoring.engine.joint_stats import JointOptions
from distributed_scoring.engine.sampler_settings import SamplerSettings
from distributed_scoring.errors import UserError
from distributed_scoring.io.output import recorded_values
from distributed_scoring.options import flag_name, flagged
from distributed_scoring.workflows.joints import JointsInputs
from distributed_scoring.workflows.variants.run import VariantsInputs
from distributed_scoring.workloads.chain import ChainOptions
from distributed_scoring.workloads.generate import GenerateOptions
from distributed_scoring.workloads.infill import InfillOptions
from distributed_scoring.workloads.pll import PLLOptions
from distributed_scoring.workloads.sample import SampleOptions

COMMON = ["in.txt", "--model", "m", "--output", "out"]

# What `_run.json` recorded of each class's defaults before its fields carried their flags (commit 66d9a6e).
RECORDED_BEFORE = {
    InfillOptions: {
        "decoder": "standard", "order": "l2r", "beam": 5, "top": None, "vocab_restrict": None, "pivot": None,
        "temperature": 1.0, "sample_top_k": 10, "top_p": 0.9, "seed": 0, "max_masks": 8, "exact_limit": 10000,
        "rescore_pll": False, "answer_column": "answer",
    },
    SampleOptions: {
        "energy": "norm", "sampler": "mh", "epochs": 10, "burn_in": 0, "chains": 1, "seed": 0, "free_all": False,
        "block": 1, "block_decay": 0, "proposal_temperature": 1.0, "target_temperature": 1.0, "anneal": 0.0,
        "top_p": 1.0, "record_every": 1, "order": "sweep", "start": "auto", "vocab_restrict": None,
        "answer_column": "answer",
    },
    ChainOptions: {"order": "l2r", "orders": 1, "seed": 0, "split_chars": False},
    PLLOptions: {"variant": "original", "per_token": False, "word_scores": False, "long_texts": "window"},
    GenerateOptions: {
        "order": "random", "sequences": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0,
        "vocab_restrict": None, "length": None, "order_column": "fill_order",
    },
}  # fmt: skip
COMMAND = {
    ScoringOptions: "score",
    RayOptions: "score",
    InfillOptions: "infill",
    SampleOptions: "sample",
    GenerateOptions: "generate",
    JointOptions: "joints",
}


def _options(command: str, cls: type, *flags: str):
    return options_from(build_parser().parse_args([command, *COMMON, *flags]), cls)


@pytest.mark.parametrize("cls", list(RECORDED_BEFORE), ids=lambda c: c.__name__)
def test_the_fingerprint_records_what_it_did_before(cls):
    options = PLLOptions.of(ScoringOptions()) if cls is PLLOptions else cls()
    assert list(recorded_values(options).items()) == list(RECORDED_BEFORE[cls].items())


@pytest.mark.parametrize("cls", list(COMMAND), ids=lambda c: c.__name__)
def test_every_flagged_field_is_a_flag_of_its_command_and_reads_back_to_the_defaults(cls):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[COMMAND[cls]]
    flags = {s for action in sub._actions for s in action.option_strings}
    assert {flag_name(f, spec) for f, spec in flagged(cls)} <= flags
    assert _options(COMMAND[cls], cls) == cls()


def test_flags_read_back_into_the_options_they_declare():
    infill = _options(
        "infill", InfillOptions, "--decoder", "top-k", "--beam", "3", "--top", "2", "--sample-top-k", "4",
        "--vocab-restrict", "A C D", "--exact-limit", "7", "--rescore-pll", "--answer-column", "gold",
    )  # fmt: skip
    assert infill == InfillOptions(
        decoder="top-k", beam=3, top=2, sample_top_k=4, vocab_restrict=("A", "C", "D"), exact_limit=7,
        rescore_pll=True, answer_column="gold",
    )  # fmt: skip
    assert infill.settings(pivot=7) == InfillSettings("top-k", "l2r", 3, 7, 1.0, 4, 0.9)
    sample = _options("sample", SampleOptions, "--sampler", "block-mh", "--block", "3", "--start", "warm", "--free-all")
    assert sample == SampleOptions(sampler="block-mh", block=3, start="warm", free_all=True)
    assert sample.settings("warm") == SamplerSettings(sampler="block-mh", block=3, start="warm")
    generate = _options("generate", GenerateOptions, "--num-sequences", "3", "--length", "4", "--top-k", "5")
    assert generate == GenerateOptions(sequences=3, length=4, top_k=5)
    args = build_parser().parse_args(
        ["joints", *COMMON, "--scheme", "contiguous", "--hcb-pivot", "gold", "--seed", "3"]
    )
    assert options_from(args, JointOptions) == JointOptions(pivot="gold")
    inputs = options_from(args, JointsInputs, paths=("in.txt",), output="out")
    assert inputs == JointsInputs(("in.txt",), "out", scheme="contiguous", seed=3)


@pytest.mark.parametrize(
    "cls, values, flag",
    [
        (InfillOptions, {"beam": 0}, "--beam 0 is out of bounds"),
        (InfillOptions, {"sample_top_k": 0}, "--sample-top-k 0 is out of bounds"),  # 0 is `filtered`'s alone
        (InfillOptions, {"decoder": "filtered"}, "--decoder 'filtered' is not one of standard, hcb"),
        (InfillOptions, {"top_p": 1.5}, "--top-p 1.5 is out of bounds"),
        (SampleOptions, {"epochs": 0}, "--epochs 0 is out of bounds"),
        (SampleOptions, {"start": "cold"}, "--start 'cold' is not one of auto, given"),
        (SampleOptions, {"block": 2}, "--sampler mh proposes one position at a time"),
        (GenerateOptions, {"sequences": 0}, "--num-sequences 0 is out of bounds"),
        (GenerateOptions, {"temperature": -1.0}, "--temperature -1 is out of bounds"),
        (ScoringOptions, {"variant": "l2r"}, "--variant 'l2r' is not one of original, word_l2r"),
        (ScoringOptions, {"batch_tokens": 0}, "--batch-tokens 0 is out of bounds"),
        (ScoringOptions, {"conditionals": 3}, "--conditionals writes a conditional per scored token"),
        (VariantsInputs, {"strategy": "marginal"}, "--strategy 'marginal' is not one of wt-marginal"),
        (ChainOptions, {"order": "zigzag"}, "--order 'zigzag' is not one of l2r"),
        (ChainOptions, {"orders": 2}, "only --order random has more than one order"),
        (JointOptions, {"pivot": "first"}, "--hcb-pivot 'first' is not one of mode"),
        (JointOptions, {"pivot": -1}, "HCB pivot token id must be non-negative"),
        (JointOptions, {"ag_iterations": 0}, "--ag-iterations 0 is out of bounds"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_its_flag(cls, values, flag):
    required = {"table": "t.csv", "output": "out", "target_seq": "MKT"} if cls is VariantsInputs else {}
    with pytest.raises(UserError, match=flag):
        cls(**required, **values)


def test_engine_settings_check_themselves_from_the_same_declaration():
    """The engines' settings (built by tests and by workloads) refuse what the options refuse; the engine alone
    admits generation's `filtered` decoder, whose top-k may be off."""
    assert InfillSettings("filtered", "given", 1, top_k=0).top_k == 0
    with pytest.raises(UserError, match="--sample-top-k 0"):
        InfillSettings("top-k", top_k=0)
    with pytest.raises(UserError, match="--energy 'cold'"):
        SamplerSettings(energy="cold")
    carried = {f.name: f.default for f in dataclasses.fields(SampleOptions)}
    shared = [f for f in dataclasses.fields(SamplerSettings) if f.name in carried and f.name != "start"]  # auto
    assert shared and all(carried[f.name] == f.default for f in shared)
