"""`dscore submit`: a Ray job whose exit code a scheduler can branch on.

`ray job submit` exits 1 for every failed entrypoint, so cron, Airflow or the caller of a KubeRay RayJob
cannot tell an audit's regression (3) from a bad option (2) or data too scant to judge (5). This submits
the entrypoint through Ray's job SDK, streams the job's log while it runs, and returns the code the
entrypoint itself exited with (`JobDetails.driver_exit_code`, which the job server records).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, TextIO

from ..errors import DataLossError, UserError
from ..stopping import Stopped

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

logger = logging.getLogger(__name__)

# The job server's address in the environment; the first set wins, as in Ray's own SDK.
ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
STATUS_WAIT_S = 30.0  # how long the job's status may lag behind the end of its log stream
STATUS_POLL_S = 0.5
SILENCE_S = 10.0  # how long the job may print nothing before this says what it is waiting for


@dataclass(frozen=True)
class Submission:
    """A job to submit: `entrypoint` is the command's words (quoted for the shell the job runs it in);
    `address` the job server's `http://HEAD:8265` (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS);
    `working_dir` a local folder uploaded as the job's working directory (or a URI of a zip Ray can read)."""

    entrypoint: tuple[str, ...]
    address: str | None = None
    working_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.entrypoint:
            raise UserError(
                "nothing to submit: put the job's command after `--`, e.g. "
                "`dscore submit --working-dir . -- python jobs/pppl_audit.py --input ...`"
            )
        if self.working_dir and "://" not in self.working_dir and not os.path.isdir(self.working_dir):
            raise UserError(
                f"--working-dir {self.working_dir!r} is not a folder: pass the folder to upload "
                "(`.` for this repository)"
            )


def job_server(given: str | None) -> str:
    """The job server to submit to: `--address`, else the environment's; an http(s) address only (Ray's
    SDK would otherwise look for a cluster on this machine, or wait on a GCS address for minutes)."""
    address = given or next((os.environ[v] for v in ADDRESS_VARIABLES if os.environ.get(v)), None)
    if not address:
        raise UserError(
            "no Ray job server given: pass --address http://HEAD:8265 or set RAY_ADDRESS "
            '(`eval "$(cluster/local_cluster.sh env)"` sets it for the local cluster)'
        )
    if not address.lower().startswith(("http://", "https://")):
        raise UserError(
            f"{address!r} is not a job server's address: pass the head's dashboard address, "
            "--address http://HEAD:8265 (the port of `ray start --dashboard-port`)"
        )
    return address


@contextlib.contextmanager
def _environment_without(names: tuple[str, ...]) -> Iterator[None]:
    """Ray's SDK lets the environment's address override the one it is given: hide it meanwhile."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def connect(address: str) -> JobSubmissionClient:
    """A client of the job server at `address`, with the token that $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH
    or ~/.ray/auth_token holds when the cluster uses token authentication (Ray's SDK reads them)."""
    from ray.job_submission import JobSubmissionClient

    with _environment_without(ADDRESS_VARIABLES):
        try:
            return JobSubmissionClient(address)
        except ConnectionError as exc:
            raise UserError(
                f"no Ray cluster answers at {address}: start it (cluster/local_cluster.sh start) or "
                f"pass the address of one that runs ({exc})"
            ) from None
        except RuntimeError as exc:  # the server answered but refused us (a missing or wrong token)
            raise UserError(f"the job server at {address} refused the connection: {_first_line(exc)}") from None


def submit(submission: Submission, log: TextIO, verbose: bool = False) -> int:
    """Submit, copy the job's log to `log` as it comes, and return the entrypoint's exit code; a job that
    ended without one (stopped, or its driver lost) raises `DataLossError`. Ray's own messages (while it
    connects, uploads the working directory and follows the log) go to a log file unless `verbose`; this
    says what it waits for before each wait (the upload, the job's start: 13 s in silence, once)."""
    address = job_server(submission.address)
    with _ray_messages_to_file(verbose):
        client = connect(address)
        runtime_env = {"working_dir": submission.working_dir} if submission.working_dir else None
        if submission.working_dir:
            folder = submission.working_dir
            logger.info(
                "submitting to %s: packing and uploading %s as the job's working directory",
                address,
                folder if "://" in folder else os.path.abspath(folder),
            )
        try:
            job = client.submit_job(entrypoint=shlex.join(submission.entrypoint), runtime_env=runtime_env)
        except (RuntimeError, ValueError) as exc:
            raise UserError(f"the job server refused the job: {_first_line(exc)}") from None
    logger.info(
        "submitted %s to %s; waiting for the cluster to start it, then its log follows (also: ray job logs %s)",
        job,
        address,
        job,
    )
    import aiohttp

    try:
        with _ray_messages_to_file(verbose):
            asyncio.run(_copy_log(client, job, log))
            details = _finished(client, job)
    except Stopped as stop:  # Ctrl-C, SIGTERM: the job runs on the cluster, not here
        stop.detail = _stop_or_detach(client, job, stop)
        raise
    except (aiohttp.ClientError, ConnectionError, RuntimeError, OSError) as exc:
        details = _ended(client, job)  # the log stream may end with an error when the job is stopped
        if details is None:
            raise DataLossError(
                f"lost the job server while job {job} ran ({_first_line(exc)}); it may still run: "
                f"`ray job status {job}` tells"
            ) from None
    return exit_code(job, details)


def _ended(client: JobSubmissionClient, job: str):
    """The job's details if the server says it has ended, else None (the server cannot be asked either)."""
    try:
        details = client.get_job_info(job)
    except Exception:  # noqa: BLE001 - the server is gone: the caller says so
        return None
    return details if details.status.is_terminal() else None


def _stop_or_detach(client: JobSubmissionClient, job: str, stop: Stopped, ask=input) -> str:
    """What a signal does to a submitted job: on a terminal, the user chooses to stop it or to leave it
    running (detach); elsewhere (a scheduler's SIGTERM, no terminal to ask) it is left running. Returns
    what was done and how to follow or stop the job."""
    follow = f"follow it with `ray job logs -f {job}`, stop it with `ray job stop {job}`"
    answer = ""
    if sys.stdin is not None and sys.stdin.isatty():
        with contextlib.suppress(EOFError):
            answer = ask(f"\n{stop.name}: stop job {job} on the cluster [s], or leave it running [D]? ").strip()
    if answer.lower().startswith("s"):
        client.stop_job(job)
        return f"job {job} stopped on the cluster (`ray job status {job}` tells when it has ended)"
    return f"job {job} keeps running on the cluster; {follow}"


@contextlib.contextmanager
def _ray_messages_to_file(verbose: bool) -> Iterator[None]:
    """Ray's messages while the job is submitted (its working directory packed and uploaded: a dozen INFO and
    WARNING lines, each printed by several handlers) and followed (`WebSocket closed ...` at its end) into
    `dscore-submit-<pid>.log` in the temporary folder, as a run keeps them in its run log; `--verbose` shows
    them. The file is removed when the body ends, and kept, its place said, only when the body failed and Ray
    said something: an empty file, or one left at every submission, would only litter the folder."""
    if verbose:
        yield
        return
    from ..pipeline.ray_log import RunLog, ray_output_to

    log = RunLog()
    path = os.path.join(tempfile.gettempdir(), f"dscore-submit-{os.getpid()}.log")
    log.open(path)
    kept = False
    try:
        with ray_output_to(log, ray_data=False):
            yield
    except Exception:
        kept = os.path.getsize(path) > 0
        if kept:
            logger.info("Ray's messages while submitting are in %s (--verbose shows them here)", path)
        raise
    finally:
        if not kept:
            with contextlib.suppress(OSError):
                os.remove(path)


async def _copy_log(client: JobSubmissionClient, job: str, log: TextIO) -> None:
    """The job's log to `log` as it comes; until its first line comes, a line every SILENCE_S says what the
    job is waiting for (its runtime environment set up, resources, its interpreter's start)."""
    waiting = asyncio.create_task(_say_while_silent(client, job))
    try:
        async for lines in client.tail_job_logs(job):
            waiting.cancel()
            log.write(lines)
            log.flush()
    finally:
        waiting.cancel()


async def _say_while_silent(client: JobSubmissionClient, job: str) -> None:
    """Every SILENCE_S, the job's status and the server's word on it (`Job has not started yet. It may be
    waiting for resources ...`, the runtime environment), so that a wait is never silent."""
    began = time.monotonic()
    while True:
        await asyncio.sleep(SILENCE_S)
        try:
            details = await asyncio.to_thread(client.get_job_info, job)
        except (RuntimeError, OSError):  # the server cannot be asked: following the log says so
            return
        status = getattr(details.status, "value", details.status)
        logger.info(
            "job %s is %s, nothing printed yet after %.0f s: %s",
            job,
            status,
            time.monotonic() - began,
            _first_line(details.message),
        )


def _finished(client: JobSubmissionClient, job: str):
    """The job's details once it has ended (the log stream may close a moment before its status says so)."""
    deadline = time.monotonic() + STATUS_WAIT_S
    while True:
        details = client.get_job_info(job)
        if details.status.is_terminal() or time.monotonic() > deadline:
            return details
        time.sleep(STATUS_POLL_S)


def exit_code(job: str, details) -> int:
    """The entrypoint's exit code; `DataLossError` for a job that has none (stopped, its driver lost, an
    environment that could not be set up) or that a signal ended."""
    code = details.driver_exit_code
    status = getattr(details.status, "value", details.status)
    if code is not None and code >= 0 and status in ("SUCCEEDED", "FAILED"):
        logger.info("job %s %s: its entrypoint exited with %d", job, status.lower(), code)
        return code
    if status == "STOPPED":
        raise DataLossError(
            f"job {job} was stopped (`ray job stop`) before it finished: what it finished is kept, submit it again "
            f"to resume; `ray job logs {job}` has its log"
        )
    ended = f"was ended by signal {-code}" if code is not None and code < 0 else f"is {status}"
    raise DataLossError(
        f"job {job} {ended} without an exit code of its own: {_first_line(details.message)}; "
        f"`ray job logs {job}` has its log"
    )


def _first_line(text: object) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else "no message"
