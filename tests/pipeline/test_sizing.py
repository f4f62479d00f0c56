"""Shards cut by estimated work (`pipeline.sizing`, `io.sources.base.ShardCutter`): the cut equals a greedy
reference on every format that can seek and on Parquet; the default shards follow the rows' cost, are
recorded in `_run.json` and kept by a rerun on a machine of another speed; --shard-rows cuts by rows."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RowCost, RunConfig, ScoringOptions, ShardCost
from distributed_scoring.engine.model_files import position_flops
from distributed_scoring.io import schema as S
from distributed_scoring.io.sources import plan_shards, read_unit, read_units
from distributed_scoring.pipeline import sizing
from distributed_scoring.workflows.score import score


def greedy_starts(lengths: list[int], cost: ShardCost, max_rows: int) -> list[int]:
    """The reference cut: a shard ends before the record that would take it past the budget or the row cap."""
    starts, work, held = [], 0.0, 0
    for i, n in enumerate(lengths):
        w = cost.row.flops(max(1.0, n / cost.bytes_per_token)) if n else 0.0
        if not starts or held == max_rows or work + w > cost.flops_per_shard:
            starts.append(i)
            work, held = 0.0, 0
        work += w
        held += 1
    return starts


COST = ShardCost(RowCost(flops_per_position=1.0, passes_per_token=1.0), bytes_per_token=2.0, flops_per_shard=2_000.0)


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_the_cut_equals_a_greedy_reference_and_reads_back_every_record(tmp_path, fmt):
    rng = random.Random(7)
    texts = ["".join(rng.choice("ACDEFGHIK") for _ in range(rng.choice([3, 10, 40, 90, 200]))) for _ in range(300)]
    path = tmp_path / f"corpus.{fmt}"
    if fmt == "txt":
        path.write_text("".join(t + "\n" for t in texts))
        lengths = [len(t) + 1 for t in texts]  # the record's bytes, its line ending included
    elif fmt == "jsonl":
        lines = [json.dumps({"text": t}) + "\n" for t in texts]
        path.write_text("".join(lines))
        lengths = [len(line) for line in lines]
    else:
        pq.write_table(pa.table({"text": texts}), path, row_group_size=37)
        lengths = [len(t) for t in texts]
    spec = InputSpec((str(path),), shard_rows=50, cost=COST)
    plan = plan_shards(spec)
    assert [s.start for s in plan] == greedy_starts(lengths, COST, 50)
    assert len({s.rows for s in plan}) > 2  # short and long rows make shards of many sizes
    read = [row for unit in read_units(plan) for _, rows in read_unit(unit, spec) for row in rows[S.TEXT].to_pylist()]
    assert read == texts


def test_a_record_past_the_budget_is_a_shard_of_its_own(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("ab\n" + "x" * 400 + "\nab\nab\n")
    plan = plan_shards(InputSpec((str(path),), cost=COST))
    assert [(s.start, s.rows) for s in plan] == [(0, 1), (1, 1), (2, 2)]


def test_on_ray_shards_cut_by_work_are_not_grouped_past_the_budget(tmp_path):
    """Ray Data's items group small read units; an item's shards are written when the item is done, so items of
    shards cut by work hold at most a budget's work: a stop on Ray loses a shard's worth, not the run."""
    from distributed_scoring.pipeline.on_ray import UNIT, _items

    path = tmp_path / "c.txt"
    path.write_text("".join(("x" * 30) + "\n" for _ in range(40)))
    spec = InputSpec((str(path),), cost=COST)
    plan = plan_shards(spec)
    assert len(plan) > 4 and all(s.work and s.work <= COST.flops_per_shard for s in plan)
    items = [json.loads(item[UNIT]) for item in _items(read_units(plan), 1000, COST.flops_per_shard)]
    assert len(items) == len(plan)
    assert len(_items(read_units(plan), 1000)) == 1  # by rows alone, the 40 rows would travel as one item


def run_json(folder) -> dict:
    return json.loads((folder / "_run.json").read_text())


def test_default_shards_follow_the_cost_and_a_rerun_elsewhere_keeps_them(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """The budget depends on the machine (its rate); the plan a folder records does not: a rerun where the
    rate is 100 times higher resumes the same shards, and --overwrite plans again."""
    corpus = tmp_path / "mixed.txt"
    corpus.write_text("".join(("word " * (2 if i % 4 else 25)).strip() + "\n" for i in range(40)))
    model = ModelSpec(str(tiny_model_dir("bert")))

    per_position = position_flops(model)

    def run(positions: float, overwrite: bool = False, given: int | None = None) -> dict:
        """A run where this machine scores `positions` forward-pass positions in a shard's time."""
        monkeypatch.setattr(sizing, "_local_flops", lambda device: positions * per_position / sizing.SHARD_SECONDS)
        spec = InputSpec((str(corpus),), shard_rows=given or 1000, fit_actors=given is None)
        score(
            RunConfig(spec, model, ScoringOptions(), str(tmp_path / ("given" if given else "out"))), overwrite=overwrite
        )
        return run_json(tmp_path / ("given" if given else "out"))

    slow = run(2e3)  # a long row alone, about 40 short ones
    cost = ShardCost.from_json(slow["shard_cost"])
    from transformers import AutoTokenizer

    texts = corpus.read_text().splitlines()
    tokens = sum(
        len(AutoTokenizer.from_pretrained(model.name)(t, add_special_tokens=False)["input_ids"]) for t in texts
    )
    assert cost.bytes_per_token == pytest.approx(sum(map(len, texts)) / tokens)  # measured on the rows themselves
    sizes = list(slow["shards"].values())
    assert sum(sizes) == 40 and 1 < len(sizes) < 40 and min(sizes) < max(sizes)
    with caplog.at_level("INFO"):
        assert run(2e5)["shards"] == slow["shards"]
    assert "already complete" in caplog.text
    fast = run(2e5, overwrite=True)
    assert len(fast["shards"]) < len(sizes)
    given = run(2e3, given=7)
    assert "shard_cost" not in given and list(given["shards"].values()) == [7, 7, 7, 7, 7, 5]
    assert pq.read_table(tmp_path / "out" / "rows").num_rows == 40
