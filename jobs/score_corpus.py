"""Score a corpus on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/score_corpus.py \
        --input s3://bucket/corpus/ --model bert-base-cased --output s3://bucket/scores/run-1

Inside a submitted job RAY_ADDRESS points at the cluster, so the pipeline joins it. Every option of
`dscore score` is accepted (`--variant`, `--text-column`, `--num-actors`, `--method chain --order random
--orders 5`, ...); `--input` may be repeated. Rerunning the same command after a failure resumes into the same output.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("score"))
