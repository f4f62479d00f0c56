"""The CPUs a process really has (affinity, cgroup quota, Ray's allocation) and torch's threads on them."""

from __future__ import annotations

import pytest

from distributed_scoring import cpus
from distributed_scoring.cpus import quota_cpus, set_torch_threads, thread_env, torch_threads, usable_cpus


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A faked machine: `fake(affinity=..., v2=..., v1=(quota, period))` writes its affinity mask and cgroup
    files (none by default) where `cpus` looks; OMP_NUM_THREADS unset."""
    monkeypatch.setattr(cpus, "CGROUP_V2_MAX", tmp_path / "cpu.max")
    monkeypatch.setattr(cpus, "CGROUP_V1_DIRS", (tmp_path / "v1",))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def fake(affinity: int = 8, v2: str | None = None, v1: tuple[int, int] | None = None) -> None:
        monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
        if v2 is not None:
            (tmp_path / "cpu.max").write_text(v2 + "\n")
        if v1 is not None:
            (tmp_path / "v1").mkdir(exist_ok=True)
            (tmp_path / "v1" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
            (tmp_path / "v1" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")

    return fake


@pytest.mark.parametrize(
    "affinity, v2, v1, expected",
    [
        (8, None, None, 8),  # no quota: the affinity mask
        (3, None, None, 3),  # pinned to 3 of the machine's cores (taskset, Slurm)
        (8, "200000 100000", None, 2),  # cgroup v2: 2 CPUs' worth of time per period
        (8, "150000 100000", None, 1),  # 1.5 CPUs: rounded down, more threads than that is the cliff
        (8, "50000 100000", None, 1),  # half a CPU: still one thread
        (8, "max 100000", None, 8),  # v2 without a quota
        (2, "400000 100000", None, 2),  # the smaller of the two
        (8, None, (300000, 100000), 3),  # cgroup v1
        (8, None, (-1, 100000), 8),  # v1 without a quota
        (8, "garbage", (300000, 100000), 3),  # an unreadable v2 file: v1 is read
    ],
)
def test_usable_cpus_follow_the_affinity_mask_and_the_cgroup_quota(machine, affinity, v2, v1, expected):
    machine(affinity, v2, v1)
    assert usable_cpus() == expected


def test_the_quota_is_the_one_the_file_says(machine):
    machine(8, "250000 100000")
    assert quota_cpus() == pytest.approx(2.5)
    machine(8, "max 100000")
    assert quota_cpus() is None


def test_threads_are_what_was_asked_never_more_than_the_usable_cpus(machine, monkeypatch):
    machine(affinity=2)
    assert [torch_threads(asked) for asked in (1, 2, 4, 64)] == [1, 2, 2, 2]
    assert torch_threads() == 2  # in process: all the usable CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert torch_threads() is None  # the user chose: torch read it when it started
    assert torch_threads(4) == 2  # a Ray actor's (Ray sets OMP_NUM_THREADS itself): its CPUs decide


def test_torch_runs_the_threads_chosen(machine):
    import torch

    before = torch.get_num_threads()
    try:
        machine(affinity=1)
        torch.set_num_threads(2)
        assert set_torch_threads() == 1 and torch.get_num_threads() == 1
        machine(affinity=3)
        assert set_torch_threads(2) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_wait_policy_is_the_users_else_the_chosen_default(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert thread_env() == {"OMP_WAIT_POLICY": "passive"}  # the measured default (cpus.OMP_WAIT_POLICY)
    monkeypatch.setattr(cpus, "OMP_WAIT_POLICY", None)
    assert thread_env() == {}  # not chosen yet: OpenMP's own default
    monkeypatch.setattr(cpus, "OMP_WAIT_POLICY", "passive")
    assert thread_env() == {"OMP_WAIT_POLICY": "passive"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert thread_env() == {"OMP_WAIT_POLICY": "active"}
