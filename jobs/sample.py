"""MLM energy sampling on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/sample.py \
        --input s3://bucket/cdr3/masked.jsonl --model "$MODEL" --energy raw --sampler mh --chains 8 \
        --epochs 20 --burn-in 5 --seed 1 --output s3://bucket/samples/run-1

Every option of `dscore sample` is accepted. Rows (and their chains) are sharded across the cluster's
actors, each holding a model replica; all chains of a shard advance in lockstep, one packed forward pass
per proposal step and one for the proposals' energies.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("sample"))
