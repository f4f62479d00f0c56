"""The base of every error meant for the user: bad input, options, model or output folder, and what a
storage error (an OSError from a disk or an object store) means.

The CLI prints these as one line and exits 2, and so an OSError that reaches it (storage that cannot be used
before any work); anything else is a bug and keeps its traceback.
"""

import errno


class UserError(ValueError):
    """A problem the user can fix; the message names the value seen and what to do."""


class DataLossError(RuntimeError):
    """Rows in != rows out: some shard is missing or incomplete. Rerunning the same command finishes it."""


def error_reason(exc: BaseException) -> str:
    """The first line of an exception's message (pyarrow's run over many lines), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# What an object store's error means, by the words the AWS SDK (under pyarrow) and boto3 use for it, and
# what to do about it; the first that matches names the cause. Anything else is quoted as it came.
CAUSES = (
    (  # the GCS client under pyarrow, with no Google credentials found (before any request is sent)
        ("OAuth2 access token", "UNAUTHENTICATED"),
        "no Google Cloud credentials: set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file (or run "
        "`gcloud auth application-default login`), and check that the machine reaches Google's servers",
    ),
    (
        ("NO_SUCH_BUCKET", "NoSuchBucket", "Bucket '", "bucket does not exist"),
        "the bucket does not exist: create it first",
    ),
    (
        (
            "ACCESS_DENIED",
            "AccessDenied",
            "INVALID_ACCESS_KEY_ID",
            "InvalidAccessKeyId",
            "SIGNATURE_DOES_NOT_MATCH",
            "SignatureDoesNotMatch",
            "EXPIRED_TOKEN",
            "ExpiredToken",
            "UNRECOGNIZED_CLIENT",
            "Forbidden",
            "credentials",
        ),
        "access denied: check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and "
        "that they may read and write there",
    ),
    (
        (
            "NETWORK_CONNECTION",
            "Could not connect",
            "Couldn't connect",
            "Could not resolve",
            "Connection refused",
            "EndpointConnectionError",
            "timed out",
            "Timeout",
        ),
        "the storage endpoint is unreachable: check the network and AWS_ENDPOINT_URL (docs/runs.md)",
    ),
)
# Errors worth retrying during a run: the endpoint unreachable or overloaded for a while (an outage, a
# throttle), never a refusal that the same request would get again.
TRANSIENT = (
    "NETWORK_CONNECTION",
    "Could not connect",
    "Couldn't connect",
    "Could not resolve",
    "Connection refused",
    "Connection reset",
    "EndpointConnectionError",
    "timed out",
    "Timeout",
    "SLOW_DOWN",
    "SlowDown",
    "SERVICE_UNAVAILABLE",
    "ServiceUnavailable",
    "INTERNAL_FAILURE",
    "InternalError",
    "THROTTLING",
    "RequestTimeout",
    "HTTP status 5",
    "curlCode",
)


# What a system error of a disk or of this machine's limits means, with what to do.
ERRNO_CAUSES = {
    errno.ENAMETOOLONG: "a name in the path is longer than the filesystem allows: use shorter folder names",
    errno.EROFS: "the filesystem is read-only: write elsewhere",
    errno.ENOSPC: "no space left on the device: free space, or write elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space, or write elsewhere",
    errno.EACCES: "permission denied: use a folder you may write to",
    errno.EMFILE: "too many open files: raise the limit (`ulimit -n 4096`)",
    errno.ENFILE: "the system's table of open files is full: end other work, or raise fs.file-max",
}


def storage_cause(exc: BaseException) -> str:
    """What an object store's (or a disk's) error means, in a few words, with what to do."""
    if isinstance(exc, OSError) and exc.errno in ERRNO_CAUSES:
        return ERRNO_CAUSES[exc.errno]
    text = str(exc)
    for words, cause in CAUSES:
        if any(w in text for w in words):
            return cause
    return error_reason(exc)


def is_transient(exc: BaseException) -> bool:
    """Whether a storage error may pass if the request is sent again later (an outage, a throttle)."""
    text = str(exc)
    return not isinstance(exc, (FileNotFoundError, PermissionError)) and any(w in text for w in TRANSIENT)
