"""The Ray a driver runs on: the cluster it joins (`cluster_address`) or the local one it embeds, with Ray's
own messages kept off the terminal (`ray_session`). Scoring on Ray Data (`on_ray`) and training on Ray
Train (`workflows/train`) both run inside it."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Iterator

from .. import stopping
from ..config import RayOptions
from ..cpus import usable_cpus
from ..errors import UserError
from .ray_log import RunLog, ray_output_to, run_log_path
from .watchdog import watching

logger = logging.getLogger(__name__)

LOCAL_SPARE_CPUS = 2  # CPUs an embedded Ray declares beyond the usable ones (cpus.usable_cpus), for read/prepare/write
GCS_ADDRESS_VARIABLE = "DSCORE_RAY_ADDRESS"  # the cluster a driver joins when no --address is given


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[None]:
    """Use the Ray this process already has (its logging left as it is), join `address`/`RAY_ADDRESS`,
    or start an embedded one (shut down again on exit). Unless `options.verbose`, Ray's own messages
    and its workers' output go to the run log in Ray's session folder, not to the terminal."""
    import ray

    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    check_open_files()
    address = cluster_address(options.address)
    with contextlib.ExitStack() as stack:
        log = None if options.verbose else RunLog()
        if log is not None:
            stack.enter_context(ray_output_to(log))
        kwargs = {} if options.verbose else {"log_to_driver": False}
        began = time.monotonic()
        if address:
            logger.info("joining the Ray cluster at %s", address)
            context = ray.init(address=address, **kwargs)
        else:
            logger.info("starting an embedded Ray (seconds on a quiet machine, a minute on a busy one)")
            with _own_session():
                context = ray.init(num_cpus=usable_cpus() + LOCAL_SPARE_CPUS, include_dashboard=False, **kwargs)
            stack.enter_context(watching())  # ends its processes should this driver be killed; stopped after shutdown
            stack.push(_shut_down)
        stopping.install()  # Ray's core worker replaced the SIGTERM handler with its crash dump
        logger.info("Ray is up (%.0f s)", time.monotonic() - began)
        if log is not None:
            log.open(run_log_path(context))
            logger.info(
                "Ray's own messages go to %s, beside its workers' logs (--verbose shows them here too)", log.path
            )
        yield


@contextlib.contextmanager
def _own_session() -> Iterator[None]:
    """Ray's processes started in a session of their own (as Ray starts them in a process group of their own
    on Windows): a signal to the driver's process group (`timeout`, `kill -TERM -PGID`, Ctrl-C) then reaches
    the driver alone, which stops within its grace period. Reaching the raylet as well, it made the driver's
    core worker end the driver, exit 1 with no word and the folder's lock left, the moment the raylet was
    gone. They still end with the driver: Ray has the kernel kill them when it dies (fate sharing), and
    the watchdog ends the rest."""
    from ray._private import services

    popen = services.ConsolePopen

    class Detached(popen):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, start_new_session=True, **kwargs)

    services.ConsolePopen = Detached
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _shut_down(kind: type | None, exc: BaseException | None, tb: object) -> None:
    """Shut the embedded Ray down, unless a signal stopped the run: `ray.shutdown` then waits up to 8 s on
    processes a kill of the process group has already ended, so the driver exits at once after its line (the
    CLI's `_stopped`) and leaves them to the watchdog (`watching`), well within a scheduler's grace period."""
    import ray

    if not isinstance(exc, stopping.Stopped):
        ray.shutdown()


# The fewest open files a driver and its embedded Ray need (measured: a one-actor run failed at 64, ran at 128),
# and what the soft limit is raised to when the hard limit allows.
MIN_OPEN_FILES = 256
WANTED_OPEN_FILES = 65536


def check_open_files() -> None:
    """Raise this process's open-files limit to what Ray's processes (which inherit it) want where the hard
    limit allows; refuse in one line, before Ray starts, where it cannot reach `MIN_OPEN_FILES` (before: Ray's
    workers died with "Too many open files" in its event log, and the run said "incomplete ... rerun")."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    if soft < MIN_OPEN_FILES:
        raise UserError(
            f"the open-files limit is {soft} (ulimit -n), too few for Ray's processes: raise it to at least "
            f"{MIN_OPEN_FILES} (e.g. `ulimit -n 4096` in the shell that runs dscore), or run without --ray"
        )


def cluster_address(given: str | None) -> str | None:
    """The Ray cluster a driver joins: `--address`, else $DSCORE_RAY_ADDRESS (what
    `cluster/local_cluster.sh env` exports), else $RAY_ADDRESS; None for an embedded Ray.

    $RAY_ADDRESS often holds the job server's http:// address (what `ray job submit` needs), which a
    driver cannot join: that is refused with the address to use instead.
    """
    address = given or os.environ.get(GCS_ADDRESS_VARIABLE) or os.environ.get("RAY_ADDRESS")
    if address and address.lower().startswith(("http://", "https://")):
        raise UserError(
            f"{address!r} is the Ray job server's address (for `ray job submit`), not one a driver can join: pass "
            f"--address HOST:PORT with the head node's GCS port (6379 unless it was started otherwise; "
            f"cluster/local_cluster.sh env exports it as {GCS_ADDRESS_VARIABLE}), or submit the run as a job"
        )
    return address
