"""Reading an input as a run reads it: every shard of its plan, each checked against the read schema."""

from __future__ import annotations

from distributed_scoring.config import InputSpec
from distributed_scoring.io import schema as S
from distributed_scoring.io.sources import plan_shards, read_unit, read_units


def read_all(spec: InputSpec) -> list[dict]:
    plan = plan_shards(spec)
    rows = []
    for unit in read_units(plan):
        for shard, table in read_unit(unit, spec):
            assert table.num_rows == shard.rows and table.schema == S.read_schema(spec.partitioned)
            rows += table.to_pylist()
    return rows
