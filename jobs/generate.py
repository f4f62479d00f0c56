"""Generation in any order on a Ray cluster (u-PMLM Algorithm 1): the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/generate.py \
        --input s3://bucket/prompts.jsonl --model "$MODEL" --order random --temperature 0.8 --top-p 0.95 \
        --num-sequences 4 --output s3://bucket/generate/run-1
    ray job submit --working-dir . -- python jobs/generate.py \
        --model "$MODEL" --length 64 --num-sequences 10000 --output s3://bucket/generate/free-1

Every option of `dscore generate` is accepted; without --input, --length gives the prompts. Rows are
sharded across the cluster's actors, each holding a model replica; every sequence of a shard goes through
one packed forward pass per step.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("generate"))
