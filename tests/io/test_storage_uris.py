"""Object-store URIs that cannot be used fail in one line, fast. (URIs refused for their shape, and the endpoint
`--verbose` names, are tested against S3 in tests/workflows/test_object_storage.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.object_store import free_port


def test_gcs_without_credentials_is_refused_in_seconds(tiny_model_dir, tmp_path):
    """Before: the GCS client tried the metadata server for its credentials again and again, for many minutes,
    before the first error. Here that server is a closed loopback port (`GCE_METADATA_ROOT`, which the GCS
    client under pyarrow reads) and no other credentials are found."""
    hidden = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "STORAGE_EMULATOR_HOST")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env.update(HOME=str(tmp_path), GCE_METADATA_ROOT=f"127.0.0.1:{free_port()}", NO_PROXY="127.0.0.1,localhost")
    dscore = str(Path(sys.executable).with_name("dscore"))
    model, output = str(tiny_model_dir("bert")), str(tmp_path / "out")
    argv = [dscore, "score", "gs://no-credentials/in.txt", "--model", model, "--output", output]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=90)  # before: minutes
    lines = [line for line in done.stderr.splitlines() if line.startswith("dscore: ")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "gs://no-credentials/in.txt" in lines[0]
    assert time.monotonic() - started < 60
