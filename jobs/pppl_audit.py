"""The nightly corpus PPPL audit on a Ray cluster: the entry point for `ray job submit`.

    ray job submit --working-dir . -- python jobs/pppl_audit.py \
        --input s3://bucket/snapshots/2026-11-22/ --partition-column source --model bert-base-cased \
        --output s3://bucket/audits/2026-11-22 --baseline s3://bucket/audits/2026-11-21/audit.json

Every option of `dscore audit` is accepted; `--input` may be repeated. The job's exit code is the
audit's (0 pass, 3 regression, 5 insufficient data, 4 baseline from another model), so a
regression, or data too scant to judge, fails the job (`--accept-insufficient` to allow the latter).
`ray job submit` exits 1 for all of them; `dscore submit --working-dir . -- python jobs/pppl_audit.py ...`
exits with the audit's own code, for a scheduler to branch on.
"""

import sys

from distributed_scoring.cli import job_main

if __name__ == "__main__":
    sys.exit(job_main("audit"))
