"""benchmarks/threads.py's own code: the configurations, the timing function and the table. Nothing is timed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import threads  # noqa: E402


def test_plan_is_the_grid_then_the_policies_and_interop_in_process():
    configs = threads.plan((1, 2), (0, 1), ("in-process", "ray-actor"))
    keys = [c.key for c in configs]
    assert len(keys) == len(set(keys)) == 2 * 2 * 2 + 2 * 2 + 2
    assert {(c.wait_policy, c.interop) for c in configs if c.where == "ray-actor"} == {(None, None)}
    assert {c.wait_policy for c in configs} == {None, "passive", "active"}
    assert {c.threads for c in configs if c.wait_policy or c.interop} == {2}


def test_time_forward_reports_the_threads_it_ran_with(tiny_model_dir):
    result = threads.time_forward(str(tiny_model_dir("bert")), threads=1, interop=None, seconds=0.05)
    assert result["torch_threads"] == 1
    assert result["forwards"] >= threads.MIN_REPEATS
    assert 0 < result["forward_s"] <= result["forward_p90_s"]
    assert result["ops"] >= 20 and result["linear_s"] > 0  # 2 layers: embeddings, 2 x (attention, FFN), head


def record(config: threads.Config, status: str = "ok", forward_s: float = 0.02) -> dict:
    rec = {
        "key": config.key,
        "config": threads.asdict(config),
        "status": status,
        "load_start": [0.5, 0, 0],
        "load_end": [0.7, 0, 0],
    }
    if status == "ok":
        rec["result"] = {"forward_s": forward_s, "ops": 50, "linear_s": 1e-4, "forwards": 9}
    return rec


def test_table_rows_have_their_header_cells_and_put_each_figure_under_its_busy_count():
    configs = threads.plan((1, 2), (0, 1), ("in-process",))
    records = [record(c, forward_s=0.001 * (1 + c.threads * 10 + c.busy)) for c in configs]
    records[-1] = record(configs[-1], "timeout")
    info = {"cpu": "cpu", "logical_cores": 2, "python": "3", "versions": {"torch": "2"}}
    lines = threads.markdown(records, info).splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1
    assert len(table) == 2 + 5  # header and rule; unset at 1 and 2 threads, passive, active, one inter-op thread
    one_thread = next(line for line in table if line.startswith("| in-process | unset | default | 1 |"))
    assert "| 11.0 (220) | 12.0 (240) |" in one_thread  # busy 0, then busy 1: forward ms (µs per op)
    assert "timeout" in next(line for line in table if "| 1 | 2 |" in line)
