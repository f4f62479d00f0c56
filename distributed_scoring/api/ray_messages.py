"""Ray's own messages kept off the terminal of the user's own Ray Data pipeline, as `dscore score --ray` keeps them.

A pipeline of a `PLLStage` prints some thirty lines of Ray's before its result: Ray's start and its
token-authentication notice, Ray Data's execution plan, its progress logged every ten seconds where no
terminal shows a bar, its advice as Python warnings, and an error-level `core_worker.cc ... constructor
arguments in the object store` line that every actor pool triggers (ray-project/ray#57733; nothing failed).
Setting the `ray.data` logger's level beforehand does not hold: Ray Data sets its loggers up again when
imported. `ray_messages_to_file` hands them all to the driver's run log (`pipeline.ray_log`) instead:

    with ray_messages_to_file() as log:   # starts Ray, or joins the one ray.init() would
        print(f"Ray's own messages: {log}")
        ds.map_batches(PLLStage, ...).write_parquet("scored/")
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..pipeline.ray_log import RunLog, ray_output_to, run_log_path


@contextlib.contextmanager
def ray_messages_to_file(**init_options: Any) -> Iterator[str]:
    """While the body runs, Ray's messages go to `dscore-driver-<pid>.log` in the Ray session's log folder
    (beside its workers' logs), whose path it yields; this package's log records and everything else
    (progress bars on a terminal, the body's own output, tracebacks) stay where they were. Ray is started, or
    joined, with `ray.init(**init_options)` unless it already runs, with its workers' output kept in their
    own logs (`log_to_driver=False`) unless `init_options` says otherwise."""
    import ray

    log = RunLog()
    with ray_output_to(log):
        context = ray.init(**{"log_to_driver": False, "ignore_reinit_error": True, **init_options})
        log.open(run_log_path(context))
        yield log.path
