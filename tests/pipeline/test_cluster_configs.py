"""The cluster configurations: `ray up` YAML valid under Ray's own schema, KubeRay manifests well formed."""

from __future__ import annotations

from pathlib import Path

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def test_ray_up_config_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((CLUSTER / "ray-up-gpu.yaml").read_text()))
    validate_config(config)
    assert "RAY_AUTH_MODE=token" in " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert config["available_node_types"]["gpu_worker"]["max_workers"] >= 1


def _gpu_group(spec: dict) -> dict:
    (group,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    return group


def test_kuberay_manifests_have_a_gpu_group_token_auth_and_the_job():
    cluster = yaml.safe_load((CLUSTER / "kuberay-raycluster.yaml").read_text())
    job = yaml.safe_load((CLUSTER / "kuberay-rayjob.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"], job["kind"]) == ("ray.io/v1", "RayCluster", "RayJob")
    for spec in (cluster["spec"], job["spec"]["rayClusterSpec"]):
        assert spec["authOptions"] == {"mode": "token"} and spec["rayVersion"] >= "2.52"
        _gpu_group(spec)
    assert job["spec"]["entrypoint"].startswith("python jobs/score_corpus.py")
    assert (CLUSTER.parent / "jobs" / "score_corpus.py").exists()
