"""Bulk infilling on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/infill.py \
        --input s3://bucket/cdr/masked.jsonl --model "$MODEL" --decoder hcb --order best-to-worst \
        --beam 10 --top 5 --vocab-restrict "A C D E F G H I K L M N P Q R S T V W Y" --output s3://bucket/infill/run-1

Every option of `dscore infill` is accepted. Rows are sharded across the cluster's actors, each holding a
model replica; all beams of a shard's rows go through one packed forward pass per fill step.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("infill"))
