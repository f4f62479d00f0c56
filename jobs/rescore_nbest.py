"""Bulk N-best rescoring on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/rescore_nbest.py \
        --dev s3://bucket/nbest/dev.jsonl --test s3://bucket/nbest/test.jsonl \
        --model bert-base-uncased --causal-model gpt2 --metric wer --append . \
        --output s3://bucket/rescoring/run-1

Every option of `dscore rescore` is accepted. Each unique hypothesis text is scored once on the
cluster's actors; tuning and the reports run on the driver.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("rescore"))
