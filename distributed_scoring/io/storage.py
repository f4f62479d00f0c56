"""Where bytes live: local paths and URIs mapped to filesystems, and opening files for reading.

pyarrow filesystems serve local paths, `file://`, `s3://`, `gs://` and `hdfs://` (listing, globbing,
random access, decompression); any other scheme smart-open knows (`https://`, `azure://`, ...) is read
as a single stream through smart-open.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from ..config import STORAGE_RETRY_ENV
from ..errors import UserError, error_reason, is_transient, storage_cause

logger = logging.getLogger(__name__)
T = TypeVar("T")

PYARROW_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs")
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}


def scheme(uri: str) -> str | None:
    return uri.split("://", 1)[0].lower() if "://" in uri else None


class StorageError(UserError):
    """A URI that cannot be used (unknown scheme, unreachable store); the message says what to do."""


# How long a run keeps sending a failed storage request again before it stops ("incomplete", exit 1): long
# enough to ride out a 60-second outage of an object store. `--storage-retry-s` sets it.
RETRY_S = 120.0
# How long the GCS client sends a failed request again on its own: without it, a machine with no Google
# credentials waits minutes on an unreachable metadata server before the first error. A run sends its writes
# again itself (`retrying`), as on S3, whose client tries only three times.
GCS_RETRY_S = 5


def retry_budget() -> float:
    return float(os.environ.get(STORAGE_RETRY_ENV, RETRY_S))


class Backoff:
    """Waits between tries of a storage request that failed on a transient error (`is_transient`): 1, 2, 4 ...
    15 s apart, until `budget_s` (default `retry_budget()`) has passed."""

    def __init__(self, what: str, budget_s: float | None = None) -> None:
        self.what = what
        self.budget_s = retry_budget() if budget_s is None else budget_s
        self.deadline = time.monotonic() + self.budget_s
        self.delay = 1.0

    def wait(self, exc: OSError) -> None:
        """Sleep before the next try; raise `exc` when it is no transient error or the budget is spent."""
        if not is_transient(exc) or time.monotonic() + self.delay > self.deadline:
            raise exc
        logger.warning("%s failed (%s); trying again in %.0f s", self.what, storage_cause(exc), self.delay)
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, 15.0)


def retrying(request: Callable[[], T], what: str, budget_s: float | None = None) -> T:
    """`request()`, sent again after a transient storage error as `Backoff` allows; then its last error goes on."""
    backoff = Backoff(what, budget_s)
    while True:
        try:
            return request()
        except OSError as exc:
            backoff.wait(exc)


def storage_error(uri: str, exc: BaseException, doing: str = "use") -> StorageError:
    """A one-line refusal before any work: which URI, what went wrong and what to do (for the URI's store: a
    gs:// URI is never told to check AWS's variables)."""
    return StorageError(f"cannot {doing} {uri!r}: {cause_for(uri, exc)}")


# The causes that name S3's settings, as they read for GCS.
GCS_CAUSES = {
    "access denied": "access denied: check the Google Cloud credentials (GOOGLE_APPLICATION_CREDENTIALS, or "
    "`gcloud auth application-default login`) and that they may read and write there",
    "the storage endpoint is unreachable": "GCS is unreachable: check the network (and STORAGE_EMULATOR_HOST "
    "where an emulator serves gs://)",
}


def cause_for(uri: str, exc: BaseException) -> str:
    """`storage_cause(exc)`, in the words of the URI's store."""
    cause = storage_cause(exc)
    if scheme(uri) in ("gs", "gcs") and "AWS" in cause:
        return next((v for k, v in GCS_CAUSES.items() if cause.startswith(k)), error_reason(exc))
    return cause


def filesystem(uri: str) -> tuple[pafs.FileSystem | None, str]:
    """(pyarrow filesystem, path in it); None for schemes that only smart-open reads."""
    s = scheme(uri)
    if s is None:
        return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    if s in ("hf", "hf-datasets"):
        raise StorageError(
            f"{uri!r}: hf:// URIs are not read directly; download the data first (e.g. "
            "datasets.load_dataset(...).save_to_disk(DIR)) and pass DIR, or a copy of its files on local disk or s3://"
        )
    if s in PYARROW_SCHEMES:
        check_object_uri(uri, s)
        try:
            if s == "s3":  # small writes as one PUT each, not a multipart upload of three requests
                fs, path = pafs.FileSystem.from_uri(f"{uri}?allow_delayed_open=true")
                _say_endpoint(uri, fs)
                return fs, path
            if s in ("gs", "gcs"):
                return pafs.FileSystem.from_uri(f"{uri}?retry_limit_seconds={GCS_RETRY_S}")
            return pafs.FileSystem.from_uri(uri)
        except (OSError, pa.ArrowInvalid) as exc:
            raise StorageError(
                f"cannot reach {uri!r} ({error_reason(exc)}); check the URI, the network and the credentials"
            ) from exc
    return None, uri


# Bucket names as the stores take them (AWS's and Google's rules): S3's 3-63 lowercase letters, digits, dots and
# hyphens; GCS's also underscores, and up to 222 characters in dotted names. Both begin and end with a letter or
# digit. Some stores accept more (moto, a bucket SeaweedFS creates on first write), AWS and GCS do not.
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
MAX_KEY_BYTES = 1024  # an object's key, UTF-8, on S3 and GCS alike
# What dscore adds under an --output folder's key, at most ("/rows/part-00000-000000000000.parquet", markers,
# reports, the lock's probe): an --output whose key leaves less room is refused before any work.
OUTPUT_KEY_ROOM = 96


def check_object_uri(uri: str, s: str) -> None:
    """Refuse an object-store URI that later joins would break or that the store would refuse part-way: a query
    (`?endpoint_override=...` works for one file but not for the files of a folder or a baseline's neighbours:
    the endpoint is set by the environment instead), an empty path component (`s3://bucket//x`), a bucket name
    the store's rules forbid, a key of over 1,024 bytes."""
    if s in ("file", "hdfs", "viewfs"):
        return
    if "?" in uri:
        raise StorageError(
            f"{uri!r}: options in the URI's query are not taken (they would be lost on the files dscore finds "
            "under it); set the endpoint with AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3 (docs/runs.md) and pass the "
            "URI without '?...'"
        )
    if "//" in uri.split("://", 1)[1].rstrip("/"):
        raise StorageError(f"{uri!r} has an empty path component ('//'): write it with single slashes")
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    if s == "s3" and not (S3_BUCKET.fullmatch(bucket) and ".." not in bucket and not _looks_like_ip(bucket)):
        raise StorageError(
            f"{uri!r}: {bucket!r} is no S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, "
            "beginning and ending with a letter or digit (AWS's rules)"
        )
    if s in ("gs", "gcs") and not (GCS_BUCKET.fullmatch(bucket) and (len(bucket) <= 63 or "." in bucket)):
        raise StorageError(
            f"{uri!r}: {bucket!r} is no GCS bucket name: 3 to 63 lowercase letters, digits, dots, hyphens and "
            "underscores, beginning and ending with a letter or digit (Google's rules)"
        )
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise StorageError(
            f"{uri!r}: its key is {size:,} bytes (UTF-8), over the {MAX_KEY_BYTES:,} bytes an object store takes: "
            "use shorter names"
        )


def check_output_key(uri: str) -> None:
    """Refuse an object-store --output whose key leaves too little room for the files dscore writes under it."""
    if scheme(uri) in (None, "file", "hdfs", "viewfs"):
        return
    check_object_uri(uri, scheme(uri))
    key = uri.split("://", 1)[1].partition("/")[2].rstrip("/")
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES - OUTPUT_KEY_ROOM:
        raise StorageError(
            f"--output {uri!r}: its key is {size:,} bytes (UTF-8); the files dscore writes under it need up to "
            f"{OUTPUT_KEY_ROOM} more, over the {MAX_KEY_BYTES:,} bytes an object store takes: use a shorter folder"
        )


def _looks_like_ip(bucket: str) -> bool:
    parts = bucket.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


_said: set[str] = set()


def _say_endpoint(uri: str, fs: pafs.FileSystem) -> None:
    """Once per bucket and process, at the level `--verbose` shows: which endpoint and region serve it."""
    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    if bucket in _said:
        return
    _said.add(bucket)
    variable = next((v for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(v)), None)
    endpoint = f"{os.environ[variable]} ({variable})" if variable else "AWS's own endpoint"
    logger.debug("s3://%s: endpoint %s, region %s", bucket, endpoint, getattr(fs, "region", "?"))


def s3_client(fs: pafs.S3FileSystem) -> Any:
    """boto3's S3 client for what pyarrow cannot send (conditional requests, listings with ETags), finding the
    store as pyarrow does: the same endpoint, region and credentials from the environment, buckets addressed
    by path where an endpoint is set (MinIO, Ceph, moto)."""
    import boto3
    from botocore.config import Config

    custom = any(os.environ.get(v) for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    config = Config(retries={"mode": "standard"}, s3={"addressing_style": "path"} if custom else None)
    return boto3.client("s3", region_name=fs.region or None, config=config)


_buckets_seen: set[tuple[str, str]] = set()  # (endpoint, bucket) found to exist by this process


def check_bucket(uri: str, fs: pafs.FileSystem) -> None:
    """Refuse an S3 --output in a bucket that does not exist, before any work: some stores (SeaweedFS) create
    a missing bucket on the first write instead of refusing it, and a typo would become a bucket. One request
    per bucket and endpoint in a process."""
    if not isinstance(fs, pafs.S3FileSystem):
        return
    from botocore.exceptions import ClientError

    client = s3_client(fs)
    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    seen = (client.meta.endpoint_url, bucket)
    if seen in _buckets_seen:
        return
    try:
        with boto_errors(f"s3://{bucket}"):
            try:
                client.head_bucket(Bucket=bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchBucket"):
                    raise StorageError(f"cannot use {uri!r}: the bucket does not exist: create it first") from None
                raise
    except OSError as exc:
        raise storage_error(uri, exc) from exc
    _buckets_seen.add(seen)


@contextlib.contextmanager
def boto_errors(where: str) -> Iterator[None]:
    """boto3's errors as OSErrors with its words and `where`, as pyarrow's are, so that `retrying` and the
    callers tell storage errors apart once."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:  # on one line: its reason may follow a line of its own
        raise OSError(f"{' '.join(str(exc).split())} ({where})") from exc


def join(base: str, relative: str) -> str:
    """`relative` under `base`, keeping the URI scheme of `base`."""
    return f"{base.rstrip('/')}/{relative}"


def compression_of(path: str) -> str | None:
    return COMPRESSIONS.get(Path(path).suffix.lower())


def open_binary(uri: str, seekable: bool) -> BinaryIO:
    """A buffered binary reader, decompressed by suffix; random access when `seekable` (uncompressed)."""
    fs, path = filesystem(uri)
    compression = compression_of(uri)
    if fs is None:
        import smart_open

        return smart_open.open(uri, "rb")
    if isinstance(fs, pafs.LocalFileSystem) and compression is None:
        return open(path, "rb")
    if seekable and compression is None:
        return io.BufferedReader(fs.open_input_file(path), 1 << 20)
    return io.BufferedReader(fs.open_input_stream(path, compression=compression), 1 << 20)


def is_seekable(uri: str) -> bool:
    """Whether a reader can jump to a byte offset (uncompressed, on a pyarrow filesystem)."""
    return compression_of(uri) is None and scheme(uri) in (None, *PYARROW_SCHEMES)
