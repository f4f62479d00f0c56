"""`PLLStage.actor_pool`: a pool of scoring actors the Ray cluster can start beside the pipeline's own tasks,
or a one-line refusal of one it never could (Ray Data would wait for it forever)."""

from __future__ import annotations

import pytest

from distributed_scoring import PLLStage, UserError
from distributed_scoring.api.pool import ActorPoolError, Pool, plan_pool


def node(cpus: float, gpus: float = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}


@pytest.mark.parametrize(
    "nodes, asked, pool",
    [
        ([node(2)], {}, Pool(1, 1.0, 0.0)),  # a 2-core machine: one actor, a CPU left for reading and writing
        ([node(8)], {}, Pool(7, 1.0, 0.0)),
        ([node(2), node(2)], {}, Pool(3, 1.0, 0.0)),  # a CPU left on one node is enough
        ([node(2), node(64, alive=False)], {}, Pool(1, 1.0, 0.0)),  # dead nodes hold nothing
        ([node(8)], {"num_cpus": 2}, Pool(3, 2.0, 0.0)),
        ([node(2)], {"num_cpus": 0.5}, Pool(2, 0.5, 0.0)),
        ([node(16, 4)], {}, Pool(4, 1.0, 1.0)),  # one actor per GPU
        ([node(16, 4)], {"num_gpus": 0}, Pool(15, 1.0, 0.0)),  # CPU actors asked for on a GPU node
        ([node(16, 4), node(16, 4)], {"size": 6}, Pool(6, 1.0, 1.0)),
        ([node(8)], {"size": 4}, Pool(4, 1.0, 0.0)),
    ],
)
def test_the_pool_fits_the_nodes(nodes, asked, pool):
    assert plan_pool(nodes, **asked) == pool


@pytest.mark.parametrize(
    "nodes, asked, says",
    [
        (
            [node(2)],
            {"size": 4},
            r"^4 PLLStage actors x 1 CPU do not fit .* \(1 node of 2 CPUs, no GPU\).*: pass size=1 or less",
        ),
        ([node(2)], {"size": 2}, "pass size=1 or less"),  # every CPU taken: the read task never runs
        ([node(2)], {"num_gpus": 1}, "no PLLStage actor of 1 CPU \\+ 1 GPU fits .*: pass num_gpus=0"),
        ([node(16, 2)], {"size": 3}, "3 PLLStage actors x 1 CPU \\+ 1 GPU .* 2 GPUs.*: pass size=2 or less"),
        (
            [node(4), node(4)],
            {"num_cpus": 6},
            "no PLLStage actor of 6 CPUs fits .*2 nodes of 4 CPUs.*num_cpus=3 or less",
        ),
        ([node(1)], {}, "no PLLStage actor .*: add CPUs or nodes"),
        ([node(2)], {"size": 0}, "size=0: .* one actor or more"),
        ([node(2)], {"num_cpus": 0}, "num_cpus=0, num_gpus=0"),
    ],
)
def test_a_pool_that_could_never_start_is_refused_in_one_line(nodes, asked, says):
    with pytest.raises(ActorPoolError, match=says) as refused:
        plan_pool(nodes, **asked)
    assert isinstance(refused.value, UserError) and "\n" not in str(refused.value)


def test_the_map_batches_arguments(ray_local):
    import ray

    args = PLLStage.actor_pool(size=2, num_cpus=0.5)
    assert isinstance(args["compute"], ray.data.ActorPoolStrategy) and args["compute"].min_size == 2
    assert (args["num_cpus"], args["num_gpus"]) == (0.5, 0.0)
    cpus = ray.cluster_resources()["CPU"]
    assert PLLStage.actor_pool()["compute"].max_size == cpus - 1  # the session's Ray: 6 CPUs declared
    with pytest.raises(ActorPoolError, match=f"pass size={cpus - 1:g} or less"):
        PLLStage.actor_pool(size=int(cpus))
