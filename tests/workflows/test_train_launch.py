"""What `dscore train` says around Ray Train's long waits, without Ray: before its workers start (they import
torch and load the model: 21 s before the first step on 2 shared cores, once in silence), when the last step is
done (its checkpoint, the model written, the workers shut down: 22 s), and how long it all took."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

from distributed_scoring.io.output import OutputDir
from distributed_scoring.workflows.train import run
from distributed_scoring.workflows.train.run import MetricsLog, TrainResources


class Ref:
    """An object ref whose value is ready."""

    def __init__(self, value) -> None:
        self.value = value


class Actor:
    """An actor handle: each method's `.remote(...)` calls it on the object at once."""

    def __init__(self, target) -> None:
        self.target = target

    def __getattr__(self, name: str):
        method = getattr(self.target, name)
        return SimpleNamespace(remote=lambda *args: Ref(method(*args)))


class FakeRay:
    """Ray's `remote`, `wait` and `get` in this process: an actor is its object, a task runs when submitted."""

    def remote(self, **options):
        def wrap(target):
            if isinstance(target, type):
                return SimpleNamespace(remote=lambda *args: Actor(target(*args)))
            return SimpleNamespace(remote=lambda *args: Ref(target(*args)))

        return wrap

    def wait(self, refs, timeout):
        return refs, []

    def get(self, ref):
        return ref.value


def test_the_launch_says_it_starts_ray_train_s_workers_then_how_long_it_took(monkeypatch, caplog, tmp_path):
    def fit(loop, job, resources, storage, embedded, relay) -> None:  # stands in for the TorchTrainer's task
        relay.post.remote(logging.INFO, "maskless step 1/1: loss 0.5")

    monkeypatch.setitem(sys.modules, "ray", FakeRay())
    monkeypatch.setattr(run, "_fit", fit)
    caplog.set_level(logging.INFO, "distributed_scoring.workflows.train")
    resources = TrainResources(num_workers=2, cpus_per_worker=1, address="127.0.0.1:6379")
    run.fit_on_ray(lambda config: None, "job", resources, OutputDir(str(tmp_path)))
    start, step, end = [r.getMessage() for r in caplog.records]
    assert start.startswith("starting Ray Train's workers (2 x 1 CPUs): each imports torch and loads the model")
    assert step == "maskless step 1/1: loss 0.5"  # the workers' lines in between, through the relay
    assert end.startswith("Ray Train has shut its workers down (") and end.endswith(" s after starting them)")


def test_worker_0_says_what_follows_the_last_step(caplog, tmp_path):
    caplog.set_level(logging.INFO, "distributed_scoring.workflows.train")
    log = MetricsLog(OutputDir(str(tmp_path)), 2, "maskless")
    log.add({"step": 1, "loss": 1.0, "lr": 1e-4}, checkpoint=False)
    log.add({"step": 2, "loss": 0.5, "lr": 1e-4}, checkpoint=True)
    *_, last_step, after = [r.getMessage() for r in caplog.records]
    assert last_step.startswith("maskless step 2/2: loss 0.5000")
    assert after == (
        "maskless: last step done; writing its checkpoint and the model, then Ray Train shuts its workers down"
    )
