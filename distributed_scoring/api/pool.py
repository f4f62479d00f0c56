"""The actor pool of `PLLStage` in the user's own Ray Data pipeline, sized from the cluster's nodes.

Ray Data starts every actor of `ActorPoolStrategy(size=n)` before it scores a batch, and the pipeline's
own read, filter and write tasks need a CPU each (Ray Data's default) beside them. A pool the cluster
cannot hold, or one that takes every CPU, therefore waits forever, printing "pending: k CPU" every ten
seconds (size=4 on a 2-core machine; size=2 too). `plan_pool` sizes a pool that starts, or refuses one
that never would, in one line that says what fits:

    >>> two_cores = [{"Alive": True, "Resources": {"CPU": 2.0}}]
    >>> plan_pool(two_cores)
    Pool(size=1, num_cpus=1.0, num_gpus=0.0)
    >>> plan_pool(two_cores, size=4)
    Traceback (most recent call last):
    ...
    distributed_scoring.api.pool.ActorPoolError: 4 PLLStage actors x 1 CPU do not fit ...: pass size=1 or less, ...

The nodes are those alive now: on an autoscaling cluster, pass `map_batches` an
`ActorPoolStrategy(min_size=..., max_size=...)` of your own instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UserError

# What the pipeline's other tasks (read, filter, write: 1 CPU each unless told otherwise) must always find
# free on some node beside the scoring actors, or Ray Data waits forever.
SPARE_CPUS = 1.0


class ActorPoolError(UserError):
    """A pool of `PLLStage` actors that the Ray cluster can never start beside the pipeline's other tasks."""


@dataclass(frozen=True)
class Pool:
    """How many `PLLStage` actors, with how many CPUs and GPUs each."""

    size: int
    num_cpus: float
    num_gpus: float

    def map_batches_args(self) -> dict[str, Any]:
        """`map_batches`' keyword arguments for this pool: compute, num_cpus, num_gpus."""
        import ray

        return {
            "compute": ray.data.ActorPoolStrategy(size=self.size),
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
        }


def actor_pool(size: int | None = None, num_cpus: float | None = None, num_gpus: float | None = None) -> dict[str, Any]:
    """`map_batches`' compute, num_cpus and num_gpus for a pool of `PLLStage` actors that this Ray cluster
    (joined with `ray.init()` here when no Ray is running yet, as Ray Data would) can start; see `plan_pool`."""
    import ray

    if not ray.is_initialized():
        ray.init()
    return plan_pool(ray.nodes(), size, num_cpus, num_gpus).map_batches_args()


def plan_pool(
    nodes: list[dict], size: int | None = None, num_cpus: float | None = None, num_gpus: float | None = None
) -> Pool:
    """The pool for `nodes` (`ray.nodes()` entries). Left out, `num_gpus` is 1 on a cluster with GPUs (an
    actor per GPU) and 0 without, `num_cpus` is 1, and `size` the most actors that fit on the nodes with
    `SPARE_CPUS` left on one of them. A given `size` that does not fit so is refused (`ActorPoolError`)."""
    free = [
        (float(node["Resources"].get("CPU", 0)), float(node["Resources"].get("GPU", 0)))
        for node in nodes
        if node.get("Alive", True)
    ]
    gpus = sum(gpu for _, gpu in free)
    per_gpu = (1.0 if gpus >= 1 else 0.0) if num_gpus is None else float(num_gpus)
    per_cpu = 1.0 if num_cpus is None else float(num_cpus)
    if min(per_cpu, per_gpu) < 0 or per_cpu == per_gpu == 0:
        raise ActorPoolError(f"num_cpus={per_cpu:g}, num_gpus={per_gpu:g}: a PLLStage actor takes some CPU or GPU")
    most = _most_actors(free, per_cpu, per_gpu)
    shape = _shape(free)
    actor = f"{per_cpu:g} CPU{'s' * (per_cpu > 1)}" + (f" + {per_gpu:g} GPU{'s' * (per_gpu > 1)}" if per_gpu else "")
    if size is None and most == 0:
        room = max((cpu for cpu, _ in free), default=0.0) - SPARE_CPUS
        if per_gpu > gpus:
            fix = "pass num_gpus=0 (or leave it out) to score on CPUs"
        else:
            fix = f"pass num_cpus={room:g} or less" if room > 0 else "add CPUs or nodes"
        raise ActorPoolError(
            f"no PLLStage actor of {actor} fits on the Ray cluster ({shape}) with {SPARE_CPUS:g} CPU left for "
            f"the pipeline's read and write tasks: {fix}"
        )
    if size is not None and size < 1:
        raise ActorPoolError(f"size={size}: a pool of PLLStage actors needs one actor or more")
    if size is not None and size > most:
        fix = f"pass size={most} or less" if most else "lower num_cpus or num_gpus"
        raise ActorPoolError(
            f"{size} PLLStage actors x {actor} do not fit on the Ray cluster ({shape}) with {SPARE_CPUS:g} CPU "
            f"left for the pipeline's read and write tasks, so Ray Data would wait for them forever: {fix}, "
            "or leave size out to have it sized"
        )
    return Pool(most if size is None else size, per_cpu, per_gpu)


def _most_actors(free: list[tuple[float, float]], per_cpu: float, per_gpu: float) -> int:
    """How many actors of `per_cpu` CPUs and `per_gpu` GPUs fit on the nodes' (CPUs, GPUs), each on the node
    with the most CPUs free that can hold it, leaving `SPARE_CPUS` on some node."""
    free = list(free)
    placed = 0
    while True:
        fits = [i for i, (cpu, gpu) in enumerate(free) if cpu >= per_cpu and gpu >= per_gpu]
        if not fits:
            return placed
        i = max(fits, key=lambda k: free[k][0])
        cpu, gpu = free[i]
        after = [*free[:i], (cpu - per_cpu, gpu - per_gpu), *free[i + 1 :]]
        if max(c for c, _ in after) < SPARE_CPUS:
            return placed
        free, placed = after, placed + 1


def _shape(free: list[tuple[float, float]]) -> str:
    cpus = sorted({cpu for cpu, _ in free}, reverse=True)
    gpus = sum(gpu for _, gpu in free)
    nodes = f"{len(free)} node{'s' * (len(free) != 1)} of {' or '.join(f'{c:g}' for c in cpus) or 'no'} CPUs"
    return nodes + (f", {gpus:g} GPUs" if gpus else ", no GPU")
