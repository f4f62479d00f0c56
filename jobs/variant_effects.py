"""Bulk variant-effect scoring of deep mutational scans on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/variant_effects.py \
        s3://bucket/proteingym/DMS_substitutions/ --reference s3://bucket/proteingym/reference.csv \
        --model /models/antiberty --strategy masked-marginal --output s3://bucket/variants/run-1

Every option of `dscore variants` is accepted. The wild types' site tables (or the distinct sequences' PLLs)
are computed on the cluster's actors, sharded by wild type; the join to the variants and the report run on
the driver.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("variants"))
