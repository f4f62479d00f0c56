"""Training on a Ray cluster: the entry point for `ray job submit` (`dscore train pmlm|maskless`).

    ray job submit --working-dir . -- python jobs/train.py maskless \
        --teacher /shared/scores/run-1 --model "$MODEL" --output /shared/students/run-1 \
        --num-workers 4 --use-gpu --epochs 10 --lr 1e-5

    ray job submit --working-dir . -- python jobs/train.py pmlm \
        --data /shared/corpus/train.jsonl --model "$MODEL" --output /shared/pmlm/run-1 --num-workers 4 --use-gpu

Every option of `dscore train maskless` / `dscore train pmlm` is accepted. The trainer's workers (one GPU each
with --use-gpu) run data-parallel; checkpoints go to --output/checkpoints, which every node must reach (a
shared filesystem): resubmitting the same job continues from the latest one.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("train"))
