"""`dscore job COMMAND`: the command line a Ray job runs, derived from the registry (the jobs/ scripts run it
too); the runs themselves are submitted to a local cluster in tests/pipeline/test_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_scoring.cli import COMMANDS, build_parser
from distributed_scoring.cli.job import NOT_JOBS, job_arguments
from distributed_scoring.errors import UserError

from helpers.cli import refusal

REPO = Path(__file__).resolve().parents[1]
PARSER = build_parser()


def test_inputs_come_as_input_flags_and_the_run_goes_through_ray():
    argv = ["--input", "a.txt", "--model", "m", "--input", "s3://b/c/", "--output", "/shared/out"]
    assert job_arguments(PARSER, "score", argv) == [
        "score",
        "a.txt",
        "s3://b/c/",
        "--model",
        "m",
        "--output",
        "/shared/out",
        "--ray",
    ]


def test_a_command_without_inputs_takes_its_own_flags_and_generate_may_go_without():
    rescore = ["--dev", "d.jsonl", "--test", "t.jsonl", "--model", "m", "--output", "s3://b/o"]
    assert job_arguments(PARSER, "rescore", rescore) == ["rescore", *rescore, "--ray"]
    assert job_arguments(PARSER, "generate", ["--length", "5", "--model", "m", "--output", "/o"])[:3] == [
        "generate",
        "--length",
        "5",
    ]


def test_a_command_that_needs_inputs_and_a_relative_output_are_refused(capsys):
    with pytest.raises(SystemExit):
        job_arguments(PARSER, "score", ["--model", "m", "--output", "/o"])
    with pytest.raises(UserError, match="--output 'out' is relative"):
        job_arguments(PARSER, "infill", ["--input", "x", "--model", "m", "--output", "out"])
    assert "is relative" in refusal(capsys, ["job", "score", "--input", "x", "--model", "m", "--output", "out"])


def test_every_scoring_command_is_a_job_and_every_jobs_script_runs_one():
    jobs = {c.name for c in COMMANDS} - set(NOT_JOBS)
    assert jobs == {"score", "rescore", "joints", "infill", "sample", "generate", "audit", "variants", "train"}
    scripts = {p.name: p.read_text() for p in (REPO / "jobs").glob("*.py")}
    assert all(any(f'job_main("{name}")' in text for text in scripts.values()) for name in jobs)


@pytest.mark.parametrize(
    "argv, usage",
    [
        (["audit", "--input", "x", "--model", "m", "--output", "/o"], "dscore audit"),
        (["rescore", "--dev", "d", "--test", "t", "--model", "m", "--output", "/o"], "dscore rescore"),
        (["train", "maskless", "--teacher", "t", "--model", "m", "--output", "/o"], "dscore train maskless"),
    ],
)
def test_an_unknown_flag_of_a_job_prints_its_command_s_usage(argv, usage, capsys):
    """`python jobs/pppl_audit.py --bogus-flag` printed the usage of `dscore` as a whole."""
    from distributed_scoring.cli import job_main

    with pytest.raises(SystemExit) as info:
        job_main(argv[0], [*argv[1:], "--bogus-flag"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f"usage: {usage} [-h]"), err
    assert f"{usage}: error: unrecognized arguments: --bogus-flag" in err
    assert ("--input flags" in err) == (argv[0] == "audit")
