"""`dscore submit` without a cluster: the addresses it takes, one line when no cluster answers, and the exit
code it reads from a finished job's details. Submissions to a live cluster: tests/pipeline/test_cluster.py."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from distributed_scoring.cli import main
from distributed_scoring.errors import DataLossError, UserError
from distributed_scoring.workflows.submit import ADDRESS_VARIABLES, exit_code, job_server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_address(monkeypatch):
    for name in ADDRESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_no_cluster_answering_is_one_line_and_exit_2(no_address, monkeypatch, capsys):
    """The address given wins over $RAY_ADDRESS (Ray's SDK would let the environment override it)."""
    given, elsewhere = f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", elsewhere)
    rc = main(["submit", "--address", given, "--", "python", "jobs/pppl_audit.py", "--input", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"dscore: error: no Ray cluster answers at {given}: ")
    assert len(err.strip().splitlines()) == 1 and elsewhere not in err


def test_addresses(no_address, monkeypatch):
    with pytest.raises(UserError, match="no Ray job server given"):
        job_server(None)
    with pytest.raises(UserError, match="not a job server's address"):
        job_server("127.0.0.1:6379")  # a GCS address: Ray's SDK would wait on it for minutes
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert job_server(None) == "http://head:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://api:8265")  # the SDK's own order
    assert job_server(None) == "http://api:8265"
    assert job_server("https://given:443") == "https://given:443"


def test_an_empty_entrypoint_or_a_missing_working_dir_is_refused(tmp_path, capsys):
    assert main(["submit", "--address", "http://127.0.0.1:1", "--"]) == 2
    assert "nothing to submit" in capsys.readouterr().err
    assert main(["submit", "--working-dir", str(tmp_path / "absent"), "--", "python", "x.py"]) == 2
    assert "is not a folder" in capsys.readouterr().err


# Job statuses as the job server writes them (ray.job_submission.JobStatus values; Ray is not imported at
# collection: importing it then hands pytest's collection-time log handlers to Ray's loggers).
@pytest.mark.parametrize(
    "status, code, expected",
    [
        ("SUCCEEDED", 0, 0),
        ("FAILED", 3, 3),
        ("FAILED", 2, 2),
        ("FAILED", 5, 5),
        ("FAILED", 1, 1),
    ],
)
def test_the_entrypoints_exit_code_is_the_commands(status, code, expected):
    assert exit_code("raysubmit_1", SimpleNamespace(status=status, driver_exit_code=code, message="")) == expected


@pytest.mark.parametrize(
    "status, code, says",
    [
        ("STOPPED", None, r"was stopped \(`ray job stop`\)"),
        ("FAILED", None, "is FAILED"),
        ("FAILED", -9, "ended by signal 9"),
    ],
)
def test_a_job_without_an_exit_code_of_its_own_is_incomplete(status, code, says):
    details = SimpleNamespace(status=status, driver_exit_code=code, message="Job was intentionally stopped.\nmore")
    with pytest.raises(DataLossError, match=says) as raised:
        exit_code("raysubmit_1", details)
    assert "ray job logs raysubmit_1" in str(raised.value) and "more" not in str(raised.value)


def test_ray_s_messages_while_submitting_are_kept_only_when_the_submission_fails(tmp_path, monkeypatch, caplog):
    """`dscore submit` left a dscore-submit-<pid>.log in the temporary folder after every submission."""
    import logging
    import tempfile

    from distributed_scoring.workflows.submit import _ray_messages_to_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with _ray_messages_to_file(False):
        logging.getLogger("ray").warning("Pushing file package 'gcs://_ray_pkg_x.zip'")
    assert not list(tmp_path.glob("dscore-submit-*.log"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="distributed_scoring"), pytest.raises(UserError):
        with _ray_messages_to_file(False):
            logging.getLogger("ray").warning("Pushing file package 'gcs://_ray_pkg_y.zip'")
            raise UserError("the job server refused the job")
    (kept,) = tmp_path.glob("dscore-submit-*.log")
    assert "_ray_pkg_y" in kept.read_text() and f"Ray's messages while submitting are in {kept}" in caplog.text
    kept.unlink()
    caplog.clear()
    # no cluster answering: Ray said nothing, so an empty file was left behind (eight in /tmp, found on review)
    with caplog.at_level(logging.INFO, logger="distributed_scoring"), pytest.raises(UserError):
        with _ray_messages_to_file(False):
            raise UserError("no Ray cluster answers at http://127.0.0.1:1")
    assert not list(tmp_path.glob("dscore-submit-*.log")) and "Ray's messages" not in caplog.text


class SlowToStart:
    """A job server's client whose job prints its first line only after `silent_s`."""

    def __init__(self, silent_s: float) -> None:
        self.silent_s = silent_s

    async def tail_job_logs(self, job: str):
        import asyncio

        await asyncio.sleep(self.silent_s)
        yield "Running entrypoint for job raysubmit_1: python jobs/score_corpus.py\n"
        await asyncio.sleep(self.silent_s)  # the job's own silence is its own: nothing is said for it
        yield "done\n"

    def get_job_info(self, job: str) -> SimpleNamespace:
        message = "Job has not started yet. It may be waiting for the runtime environment to be set up.\nmore"
        return SimpleNamespace(status="PENDING", message=message)


def test_a_job_slow_to_start_is_said_to_be_waiting_until_its_first_line(monkeypatch, caplog):
    """A submitted job printed nothing for 13 s while the cluster set it up and started its interpreter."""
    import asyncio
    import io
    import logging

    from distributed_scoring.workflows import submit

    monkeypatch.setattr(submit, "SILENCE_S", 0.1)
    log = io.StringIO()
    with caplog.at_level(logging.INFO, logger="distributed_scoring"):
        asyncio.run(submit._copy_log(SlowToStart(0.35), "raysubmit_1", log))
    assert log.getvalue() == "Running entrypoint for job raysubmit_1: python jobs/score_corpus.py\ndone\n"
    said = [r.getMessage() for r in caplog.records]
    assert 2 <= len(said) <= 3, said  # at 0.1, 0.2 and maybe 0.3 s; none during the job's own silence
    assert said[0] == (
        "job raysubmit_1 is PENDING, nothing printed yet after 0 s: Job has not started yet. It may be waiting "
        "for the runtime environment to be set up."
    )
