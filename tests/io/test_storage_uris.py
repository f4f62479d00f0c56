"""Object-store URIs that cannot be used fail in one line, fast: bucket names and keys the stores' rules forbid,
a missing bucket, a store's own words for a cause. (URIs refused for their shape, and the endpoint `--verbose`
names, are tested against S3 in tests/workflows/test_object_storage.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_scoring.errors import error_reason
from distributed_scoring.io.storage import boto_errors, check_object_uri, storage_error

from helpers.cli import refusal
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


# Names and keys checked before work, in one line, whatever the store would do with them (moto took a key of
# 1,100 bytes; SeaweedFS creates a missing bucket on the first write), and each store's own words for a cause.


def score_args(tmp_path: Path, model: str, output: str) -> list[str]:
    path = tmp_path / "in.txt"
    path.write_text("the cat sat\non the mat\n")
    return ["score", str(path), "--model", model, "--output", output]


@pytest.mark.parametrize(
    "uri, says",
    [
        ("s3://Bad_Bucket!/x", "is no S3 bucket name"),
        ("s3://ab/x", "is no S3 bucket name"),
        ("s3://my..bucket/x", "is no S3 bucket name"),
        ("s3://192.168.1.10/x", "is no S3 bucket name"),
        ("gs://Bad_Bucket!/x", "is no GCS bucket name"),
        (f"s3://bucket/{'k' * 1100}", "its key is 1,100 bytes (UTF-8), over the 1,024 bytes"),
        (f"s3://bucket/{'é' * 520}", "its key is 1,040 bytes"),
    ],
)
def test_a_bad_bucket_name_or_key_is_one_line_before_work(uri, says, tiny_model_dir, tmp_path, capsys):
    """Before: `s3://Bad_Bucket!/x` ended '...: Parameter validation failed:' with the reason cut off."""
    line = refusal(capsys, score_args(tmp_path, str(tiny_model_dir("bert")), uri))
    assert uri in line and says in line, line
    assert not (tmp_path / "x").exists()


def test_a_good_name_passes_the_check():
    check_object_uri("s3://my-bucket.v2/a/b.txt", "s3")
    check_object_uri("gs://my_bucket-1/a/b.txt", "gs")
    check_object_uri(f"s3://bucket/{'k' * 1024}", "s3")


def test_an_output_key_leaves_room_for_the_run_s_files(tiny_model_dir, tmp_path, capsys):
    output = f"s3://bucket/{'k' * 1000}"
    line = refusal(capsys, score_args(tmp_path, str(tiny_model_dir("bert")), output))
    assert "its key is 1,000 bytes" in line and "use a shorter folder" in line


def test_a_boto_error_keeps_its_reason_on_one_line():
    import boto3

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with pytest.raises(OSError) as raised:
        with boto_errors("s3://Bad_Bucket!/x"):
            client.head_object(Bucket="Bad_Bucket!", Key="x")  # refused by boto3 before any request
    reason = error_reason(raised.value)
    assert "Parameter validation failed: Invalid bucket name" in reason and "(s3://Bad_Bucket!/x)" in reason


def test_an_output_in_a_missing_bucket_is_refused_where_the_store_would_create_it(s3, tiny_model_dir, tmp_path, capsys):
    """SeaweedFS creates a missing bucket on the first write; moto refuses it: both are refused before work."""
    line = refusal(capsys, score_args(tmp_path, str(tiny_model_dir("bert")), "s3://no-such-bucket-here/out"))
    assert "s3://no-such-bucket-here/out" in line and "the bucket does not exist" in line
    assert "no-such-bucket-here" not in [b["Name"] for b in s3.client.list_buckets()["Buckets"]]


def test_a_gcs_output_without_credentials_names_google_s_credentials_not_aws(tiny_model_dir, tmp_path):
    """Before: 'the storage endpoint is unreachable: check the network and AWS_ENDPOINT_URL'."""
    hidden = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "STORAGE_EMULATOR_HOST")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env.update(HOME=str(tmp_path), GCE_METADATA_ROOT=f"127.0.0.1:{free_port()}", NO_PROXY="127.0.0.1,localhost")
    dscore = str(Path(sys.executable).with_name("dscore"))
    args = [dscore, *score_args(tmp_path, str(tiny_model_dir("bert")), "gs://no-credentials/out"), "--unsafe-lock"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=90)
    lines = [line for line in done.stderr.splitlines() if line.startswith("dscore: ")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "gs://no-credentials/out" in lines[0] and "GOOGLE_APPLICATION_CREDENTIALS" in lines[0]
    assert "AWS" not in lines[0]


def test_gcs_words_for_causes_that_name_aws():
    unreachable = OSError("curlCode: 7, Couldn't connect to server")
    assert "AWS" in storage_error("s3://b-1/x", unreachable).args[0]
    told = storage_error("gs://b-1/x", unreachable).args[0]
    assert "GCS is unreachable" in told and "AWS" not in told
    denied = storage_error("gs://b-1/x", OSError("HTTP 403 Forbidden")).args[0]
    assert "GOOGLE_APPLICATION_CREDENTIALS" in denied and "AWS" not in denied
