"""Pairwise joints from MLM conditionals on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/pairwise_joints.py \
        --input s3://bucket/snli/sentences.txt --model bert-base-cased --scheme contiguous \
        --examples 1000 --output s3://bucket/joints/snli-contiguous

Every option of `dscore joints` is accepted. Examples are drawn on the driver; their conditionals
(2|V| masked passes each) and the five constructions run on the cluster's actors.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("joints"))
