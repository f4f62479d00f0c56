"""The CPUs this process may really use, and how many intra-op threads torch runs on them.

`os.cpu_count()` counts the machine's cores, not this process's: a container limited by a CPU quota, a
process pinned to some cores (taskset, a Slurm allocation) or a Ray actor of 1 CPU on a 64-core node all
see every core. A torch pool sized to those cores runs more threads than there are CPUs to run them, and
on busy CPUs every small op then waits for its slowest thread: 10-50 times as long (the thread cliff
that `benchmarks/threads.py` measures). So threads follow the smallest of the affinity mask, the cgroup's CPU
quota and, on a Ray worker, the CPUs Ray gave it.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")  # "<quota> <period>" in µs, or "max <period>"
CGROUP_V1_DIRS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))  # cpu.cfs_quota_us, cpu.cfs_period_us
# OpenMP's wait policy for torch's threads, set before torch starts (OpenMP reads it once; a user's
# OMP_WAIT_POLICY always wins). Passive: a thread that waits at a barrier sleeps instead of spinning, which
# costs about 20 % on an idle machine and avoids a 20x cliff when lower-priority work shares the cores
# (the measurements: docs/ray.md "Threads", benchmarks/RESULTS.md "Threads").
OMP_WAIT_POLICY: str | None = "passive"


def affinity_cpus() -> int:
    """The CPUs this process may be scheduled on (all of the machine's where the system cannot tell)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def quota_cpus() -> float | None:
    """The CPUs the cgroup's quota allows this process per period (cgroup v2, else v1); None without a quota."""
    try:
        quota, period = CGROUP_V2_MAX.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in CGROUP_V1_DIRS:
        try:
            quota, period = (int((folder / name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        except (OSError, ValueError):
            continue
        return None if quota <= 0 or period <= 0 else quota / period
    return None


def ray_cpus() -> float | None:
    """The CPUs Ray assigned to this process's task or actor (1 where it assigned none, as Ray's own
    OMP_NUM_THREADS default has it); None outside a Ray worker. Ray is not imported here: a Ray worker
    has imported it already, and a plain process should not pay seconds for it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:  # the driver: Ray assigned it nothing
        return None
    return context.get_assigned_resources().get("CPU") or 1.0


def usable_cpus() -> int:
    """The whole CPUs this process can count on: the smallest of its affinity mask, its cgroup quota and
    its Ray allocation, rounded down (a quota of 1.5 CPUs gives 1: more threads than that is the cliff),
    at least 1."""
    limits = [affinity_cpus(), quota_cpus(), ray_cpus()]
    return max(1, math.floor(min(c for c in limits if c is not None)))


def torch_threads(asked: int | None = None) -> int | None:
    """The intra-op threads torch should run: `asked` (a Ray actor's or a training worker's CPUs) but never
    more than the usable CPUs; without `asked`, all the usable CPUs, unless OMP_NUM_THREADS is set (the
    user chose, and torch read it when it started): then None, torch left as it is."""
    if asked is None:
        return None if os.environ.get("OMP_NUM_THREADS") else usable_cpus()
    return max(1, min(asked, usable_cpus()))


def set_torch_threads(asked: int | None = None) -> int:
    """Sizes torch's intra-op pool by `torch_threads(asked)`; the threads torch now runs."""
    import torch

    threads = torch_threads(asked)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def thread_env() -> dict[str, str]:
    """The environment torch's threads start with, where this project sets it (the command's start, before
    torch is imported; the Ray scoring actors' runtime_env, for nodes that do not share the driver's
    environment): the user's OMP_WAIT_POLICY, else the chosen default, else nothing."""
    policy = os.environ.get("OMP_WAIT_POLICY") or OMP_WAIT_POLICY
    return {"OMP_WAIT_POLICY": policy} if policy else {}
