"""The in-process run: plan -> (read -> prepare -> score -> write) per shard -> aggregate.

The Ray pipeline (`pipeline.py`) runs the same stage objects on tasks and actors; this module is the
single-process composition of them, used when no cluster is wanted.
"""

from __future__ import annotations

import logging

from .aggregate import summarize
from .config import RunConfig
from .output import OutputDir, fingerprint
from .prepare import Preparer
from .progress import Progress
from .scorer import Scorer
from .sources import plan_shards, read_unit, read_units

logger = logging.getLogger(__name__)


def run_local(config: RunConfig, overwrite: bool = False, progress: bool | None = None) -> dict:
    """Score every input row in this process and return the summary (also written to summary.json)."""
    plan = plan_shards(config.inputs)
    out = OutputDir(config.output)
    done = out.start(fingerprint(config, plan), overwrite)
    todo = [shard for shard in plan if shard.key not in done]
    if done:
        logger.info("resuming: %d of %d shards already done", len(plan) - len(todo), len(plan))
    if todo:
        scorer = Scorer(config.model, config.scoring)
        preparer = Preparer(scorer.mlm.tokenizer, scorer.mlm.max_length)
        bar = Progress(sum(s.rows for s in todo), bar=progress)
        try:
            for unit in read_units(todo):
                for shard, rows in read_unit(unit, config.inputs):
                    out.write_shard(shard.key, scorer(preparer(rows)), scorer.mlm.signature)
                    bar.update(shard.rows)
        finally:
            bar.close()
    return summarize(out, plan, config)
