"""The sizing of a Ray run's stages: how many scoring actors, with how many CPUs (and GPUs) each, and how
many tokenising actors, computed once from the cluster's nodes before the dataset is built (`on_ray.py`
passes it to `map_batches`). Every actor must fit on one node, and reading, tokenising and writing must
always keep CPUs to run on, or Ray Data would wait forever or hang silently.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from ..config import RayOptions
from ..errors import UserError

logger = logging.getLogger(__name__)

IO_CPUS = 0.25  # read and write tasks wait on storage more than they compute
NODE_WAIT_S = 60.0  # how long a run on a joined cluster waits for a node that can hold a scoring actor
NODE_POLL_S = 5.0


@dataclass(frozen=True)
class StageResources:
    """The `map_batches` sizing, computed once from the cluster (see `plan_resources`)."""

    actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads_per_actor: int
    prepare_actors: tuple[int, int]

    def __str__(self) -> str:
        gpus = f", {self.gpus_per_actor:g} GPU" if self.gpus_per_actor else ""
        low, high = self.prepare_actors
        return (
            f"{self.actors} scoring actor{'s' * (self.actors > 1)} x {self.cpus_per_actor:g} CPU{gpus} "
            f"({self.threads_per_actor} torch thread{'s' * (self.threads_per_actor > 1)} each), "
            f"{low}-{high} tokenising actor{'s' * (high > 1)}"
        )

    def at_most(self, shards: int) -> StageResources:
        """No more scoring or tokenising actors than shards to score: an actor beyond that would start and
        load the model (seconds of a node's CPUs, a replica's memory, a GPU held) and never get a shard. Small
        runs and resumed ones with a few shards left are the common case."""
        actors = max(1, min(self.actors, shards))
        low, high = self.prepare_actors
        return replace(self, actors=actors, prepare_actors=(min(low, actors), max(1, min(high, actors))))


SPARE_CPUS = 1 + 2 * IO_CPUS  # one tokenising actor and a read and a write task must always find room
_WHOLE_CPUS = (4.0, 3.0, 2.0, 1.0)  # CPUs per CPU actor when the user fixed neither actors nor CPUs


def node_cpus(nodes: list[dict]) -> list[float]:
    """The CPUs of each alive node (`ray.nodes()` entries), largest first."""
    cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in nodes if n.get("Alive", True)]
    return sorted((c for c in cpus if c > 0), reverse=True)


def _placed(cpus: list[float], per_actor: float, actors: int) -> list[float] | None:
    """Free CPUs per node after placing `actors` actors of `per_actor` CPUs each on the freest nodes;
    None when they do not all fit, or leave no room for tokenising, reading and writing."""
    free = list(cpus)
    for _ in range(actors):
        i = max(range(len(free)), key=free.__getitem__)
        if free[i] + 1e-9 < per_actor:
            return None
        free[i] -= per_actor
    if sum(free) + 1e-9 < SPARE_CPUS or max(free) + 1e-9 < 1:
        return None
    return free


def _most_actors(cpus: list[float], per_actor: float) -> int:
    actors = 0
    while _placed(cpus, per_actor, actors + 1) is not None:
        actors += 1
    return actors


def _sized_to_fit(cpus: list[float], actors: int, ceiling: float) -> float | None:
    """The most CPUs per actor, at most `ceiling`, with which `actors` actors fit beside the other stages
    (in quarters of a CPU, or hundredths below a quarter); None when not even a hundredth does."""
    quarters = [k / 4 for k in range(int(ceiling * 4), 0, -1)]
    hundredths = [k / 100 for k in range(min(24, int(ceiling * 100)), 0, -1)]
    return next((c for c in quarters + hundredths if _placed(cpus, c, actors) is not None), None)


def plan_resources(nodes: list[dict], options: RayOptions, device: str) -> StageResources:
    """Size the scoring actors node by node, so that every actor fits on one node and read, prepare
    and write always keep CPUs to run on.

    What the user fixed is kept and the rest sized around it. GPU clusters: one actor per GPU (or
    `num_actors`), 1 CPU each unless fewer fit. CPU clusters: actors of `cpus_per_actor` CPUs (default:
    the largest of 4, 3, 2, 1 with which one actor fits beside the other stages, else a fraction of a
    CPU), as many as fit; when only the number of actors is given, their CPUs are sized to fit, down to
    fractions of a CPU (Ray schedules fractional CPUs; torch then runs one thread). An embedded Ray
    declares 2 CPUs beyond the machine's cores for the other stages. Only what cannot run is refused,
    with what to change: an actor no node can hold or more GPU actors than GPUs (Ray Data would wait
    forever), and actors that leave the other stages no CPU (Ray Data would hang silently).
    """
    cpus = node_cpus(nodes)
    total = sum(cpus)
    gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive", True))
    use_gpus = device in ("auto", "cuda") and gpus >= 1
    if device.startswith("cuda:"):
        raise UserError(
            f"--device {device} picks one GPU of this machine; on Ray every scoring actor is given a "
            "GPU of its own: use --device cuda"
        )
    if device.startswith("cuda") and gpus < 1:
        raise UserError("--device cuda was asked for, but the Ray cluster has no GPUs")
    if not cpus:
        raise UserError("the Ray cluster has no alive node with CPUs; start its nodes or check --address")
    if use_gpus:
        cpus_per_actor, actors = _gpu_plan(cpus, options, gpus)
    else:
        cpus_per_actor, actors = _cpu_plan(cpus, options)
    spare = total - actors * cpus_per_actor
    return StageResources(
        actors=actors,
        cpus_per_actor=cpus_per_actor,
        gpus_per_actor=1.0 if use_gpus else 0.0,
        threads_per_actor=max(1, int(cpus_per_actor)),
        prepare_actors=(1, max(1, min(actors, int(spare - 2 * IO_CPUS)))),
    )


def _shape(cpus: list[float]) -> str:
    return f"{len(cpus)} node(s) of {', '.join(f'{c:g}' for c in cpus)} CPUs"


def _gpu_plan(cpus: list[float], options: RayOptions, gpus: float) -> tuple[float, int]:
    """(CPUs per actor, actors) of one GPU each: as many actors as GPUs unless fewer are asked for."""
    actors = options.num_actors or int(gpus)
    if actors > gpus:
        raise UserError(f"{actors} scoring actors need {actors} GPUs; the cluster has {gpus:g}: lower --num-actors")
    if options.cpus_per_actor is not None:
        if _placed(cpus, options.cpus_per_actor, actors) is None:
            raise UserError(
                f"{actors} GPU actors x {options.cpus_per_actor:g} CPUs do not fit beside the other "
                f"stages on {_shape(cpus)}; lower --cpus-per-actor, or leave it out to have it sized"
            )
        return options.cpus_per_actor, actors
    per_actor = _sized_to_fit(cpus, actors, 1.0)
    if per_actor is None:
        raise UserError(
            f"{actors} GPU actors leave no CPUs for reading, tokenising and writing "
            f"({SPARE_CPUS:g} needed) on {_shape(cpus)}; add CPUs or lower --num-actors"
        )
    if per_actor < 1:
        logger.info("%d GPU actors: %g CPUs each fit on %s", actors, per_actor, _shape(cpus))
    return per_actor, actors


def _cpu_plan(cpus: list[float], options: RayOptions) -> tuple[float, int]:
    """(CPUs per actor, actors) on CPU nodes of `cpus` CPUs each, following what the user fixed."""
    largest, shape = cpus[0], _shape(cpus)
    per_actor, actors = options.cpus_per_actor, options.num_actors
    if per_actor is not None and per_actor > largest:
        raise UserError(
            f"no node can hold a scoring actor of {per_actor:g} CPUs: the cluster has {shape}; "
            f"lower --cpus-per-actor to at most {largest:g}"
        )
    if per_actor is None:
        whole = [c for c in _WHOLE_CPUS if actors is None and _placed(cpus, c, 1) is not None]
        per_actor = whole[0] if whole else _sized_to_fit(cpus, actors or 1, min(4.0, largest))
        if per_actor is None:
            what, fix = (
                (f"{actors} scoring actors do not fit", "lower --num-actors")
                if actors
                else ("no scoring actor fits", "add CPUs or nodes")
            )
            raise UserError(
                f"{what} on {shape} beside the {SPARE_CPUS:g} CPUs that reading, tokenising and "
                f"writing need, even at a hundredth of a CPU each; {fix}"
            )
        if actors is None:
            return per_actor, _most_actors(cpus, per_actor)
        logger.info("%d scoring actors asked for: %g CPUs each fit on %s", actors, per_actor, shape)
        return per_actor, actors
    if actors is None:
        actors = _most_actors(cpus, per_actor)
        if actors == 0:
            raise UserError(
                f"a scoring actor of {per_actor:g} CPUs leaves too few of the CPUs on {shape} for "
                f"reading, tokenising and writing ({SPARE_CPUS:g} needed); lower --cpus-per-actor"
            )
        return per_actor, actors
    if _placed(cpus, per_actor, actors) is None:
        raise UserError(
            f"{actors} scoring actors x {per_actor:g} CPUs do not fit on {shape} beside the {SPARE_CPUS:g} CPUs "
            "that reading, tokenising and writing need (Ray Data would stall); lower --num-actors or "
            "--cpus-per-actor, or leave one of them out to have it sized to fit"
        )
    return per_actor, actors


def plan_when_ready(options: RayOptions, device: str, joined: bool) -> StageResources:
    """Plan from the nodes alive now; on a joined cluster whose nodes cannot hold an actor yet, re-plan as
    nodes join, for up to NODE_WAIT_S, then fail with the planner's message."""
    import ray

    deadline = time.monotonic() + (NODE_WAIT_S if joined else 0.0)
    while True:
        try:
            return plan_resources(ray.nodes(), options, device)
        except UserError as exc:
            if time.monotonic() >= deadline:
                raise
            logger.info("waiting for nodes to join (%s)", exc)
            time.sleep(NODE_POLL_S)
