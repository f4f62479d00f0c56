"""row_stats.parquet: the per-row figures an audit writes beside audit.json, which the next night's baseline
intervals and the history's quantiles read (one row per scored row: its id, partition, whether it scored, its
PLL and its token and word counts)."""

from __future__ import annotations

import pyarrow as pa

from ...io import schema as S

__all__ = ["OK_COLUMN", "ROW_STATS_FILE", "ROW_STATS_SCHEMA"]

ROW_STATS_FILE = "row_stats.parquet"  # per-row figures beside audit.json: what the next night's intervals need
OK_COLUMN = "ok"
ROW_STATS_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.PARTITION, pa.string(), nullable=False),
        pa.field(OK_COLUMN, pa.bool_(), nullable=False),
        pa.field(S.PLL, pa.float64()),  # null on error rows
        pa.field(S.N_TOKENS, pa.int64(), nullable=False),
        pa.field(S.N_WORDS, pa.int64(), nullable=False),
    ]
)
