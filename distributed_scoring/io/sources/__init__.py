"""Shard planning and the readers of every input format: `plan` cuts the inputs into shards and picks
each format's reader; `base` holds the `Shard` and the rows every reader makes; one module per format
reads it (`lines`: text, JSONL, CSV, TSV; `parquet`; `hf`: `datasets` folders).

What the rest of the package imports is re-exported here.
"""

from .base import Shard, ok_row
from .lines import without_lone_surrogates
from .plan import plan_shards, read_unit, read_units, shard_ids

__all__ = ["Shard", "ok_row", "plan_shards", "read_unit", "read_units", "shard_ids", "without_lone_surrogates"]
