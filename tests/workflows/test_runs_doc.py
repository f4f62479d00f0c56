"""docs/runs.md's MinIO example runs as written against the suite's S3 server (moto), only its endpoint
swapped for the server's (moto takes any credentials, the doc's MinIO defaults among them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import tiny
from helpers.object_store import CREDENTIALS, Bucket

DOC = Path(__file__).resolve().parents[2] / "docs" / "runs.md"


def minio_example() -> str:
    text = DOC.read_text()
    return re.search(r"<!-- minio-example -->\n```bash\n(.*?)```", text, re.S).group(1)


def test_the_minio_example_runs_as_written(moto_server, tiny_model_dir, tmp_path):
    script = minio_example()
    assert "export AWS_ENDPOINT_URL=http://localhost:9000" in script
    script = script.replace("http://localhost:9000", moto_server.endpoint)
    client = Bucket.create(moto_server).client  # a client of the server; the doc's bucket made with it
    client.create_bucket(Bucket="nightly")
    corpus = "".join(f"{line}\n" for line in tiny.CORPUS)
    client.put_object(Bucket="nightly", Key="in/corpus.txt", Body=corpus.encode())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MODEL": str(tiny_model_dir("bert")),
        "AWS_EC2_METADATA_DISABLED": CREDENTIALS["AWS_EC2_METADATA_DISABLED"],
    }
    done = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK: s3://nightly/out/2026-11-28" in done.stdout, done.stdout
