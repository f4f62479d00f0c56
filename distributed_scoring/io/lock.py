"""One run at a time per output folder: `DIR/_lock.json` names the run that holds the folder.

Two runs writing one folder would delete each other's temporary files and mix their shards. The lock
holds the host, pid (and pid namespace), start time and a heartbeat that a daemon thread on the driver
refreshes every `HEARTBEAT_S`; it is released (deleted) when the run ends, also on error. A second run
finds it and stops at once, naming the holder.

Every change of the lock is one request that the store itself makes conditional (`LockFile`), so that two
runs can never both believe they hold it: the lock is created only if absent (a hard link on a local or shared
filesystem, `If-None-Match: *` on S3), and a heartbeat, a release or the take-over of a left-over lock
applies only to the version read (the ETag on S3; on a filesystem, the bytes read, swapped by rename).
A store without such requests (gs://, hdfs://) is refused before any work unless `--unsafe-lock` (env
`UNSAFE_LOCK_ENV`) accepts a lock that two runs starting at the same instant could both take.

An S3 endpoint is not trusted to keep those conditions: before its first lock in a process, `prove_store` sends
each kind of request the lock uses to a probe object of the run's own beside the lock (a create twice, a
replace and a delete at a stale ETag) and checks that the store refused what it had to (a store or a proxy that
drops `If-None-Match`/`If-Match` lets every run in). One that does not is refused in one line naming
`--unsafe-lock`; with it, the lock there is check-then-write. The verdict is kept per endpoint for the process.

Left-over locks are taken over, with a warning, when
- the holder ran on this host, in this pid namespace, and its pid is gone: the run was killed (`kill -9`,
  out of memory), and rerunning the same command resumes as it always did;
- its heartbeat is older than `STALE_AFTER_S`, the holder being on another host or gone silent (a run that
  stopped on a storage error, a lost node): a rerun on any host resumes. Should the old holder come back,
  its heartbeat finds the lock taken and says so (`lost`); it never deletes the new holder's lock.

`--overwrite` never breaks a live lock. A heartbeat that fails (a storage outage) is logged and tried again
at the next beat: the thread outlives failed requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Protocol

import pyarrow.fs as pafs

from .. import stopping
from ..config import UNSAFE_LOCK_ENV
from ..errors import UserError
from .output import LOCK_FILE, OutputDir
from .storage import boto_errors, s3_client, storage_cause, storage_error

logger = logging.getLogger(__name__)

HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


class FolderLockedError(UserError):
    """Another run holds the output folder; the message says which and what to do."""


class UnsafeStoreError(FolderLockedError):
    """The store ignores a condition the lock relies on (`prove_store`): it cannot hold the lock."""


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: written as `_lock.json`; `token` tells this run's lock from a newer one."""

    host: str
    pid: int
    pid_namespace: str | None  # two containers may share a host name, never a pid namespace
    started: float
    heartbeat: float
    token: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (since {_when(self.started)}, last heartbeat {_when(self.heartbeat)})"

    def killed(self) -> bool:
        """Whether the holder is certainly gone: a process of this host and pid namespace that no longer exists."""
        return (
            self.host == socket.gethostname()
            and self.pid_namespace == current_pid_namespace()
            and not _pid_alive(self.pid)
        )

    def stale_because(self, now: float, stale_after_s: float) -> str | None:
        """Why this lock looks left behind by a run that is gone, or None when it may be live."""
        if now - self.heartbeat > stale_after_s:
            return f"whose heartbeat is {now - self.heartbeat:.0f} s old (stale after {stale_after_s:.0f} s)"
        return None

    def encoded(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode("utf-8")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def current_pid_namespace() -> str | None:
    """This process's pid namespace (Linux); None elsewhere, where the host name alone tells."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(data: bytes | None) -> Holder | None:
    """The holder a lock's bytes name; unreadable bytes name an unknown run whose heartbeat is unknown (stale)."""
    if data is None:
        return None
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):
        return Holder("?", -1, None, 0.0, 0.0, "")


def read_holder(out: OutputDir) -> Holder | None:
    """The lock's holder, or None when the folder is not locked."""
    return _holder(lock_file(out).read()[0])


class LockFile(Protocol):
    """The lock's one object, changed only by requests that the store applies conditionally. A version
    names what was read; every call returns None (or False) when the condition did not hold."""

    def read(self) -> tuple[bytes | None, str | None]:
        """(bytes, version), or (None, None) when absent."""

    def create(self, data: bytes) -> str | None:
        """Write `data` if no lock exists: the new version, or None."""

    def replace(self, data: bytes, version: str) -> str | None:
        """Write `data` if the lock is still at `version`: the new version, or None."""

    def delete(self, version: str) -> bool:
        """Delete the lock if it is still at `version`."""


class LocalLockFile:
    """A lock on a local or shared filesystem: created whole by a hard link (O_EXCL where there are none);
    deleted by renaming the version read out of the way first (one rename wins), then checking that it was
    that version; replaced by rename."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> tuple[bytes | None, str | None]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def create(self, data: bytes) -> str | None:
        """Written whole under a name of its own, then hard-linked into place (a link fails where the lock
        exists): a reader never sees a lock half written, which it would take for a stale one and take over.
        Where the filesystem has no hard links, created with O_EXCL and written."""
        temporary = self._aside()
        with open(temporary, "wb") as f:
            f.write(data)
        try:
            os.link(temporary, self.path)
        except FileExistsError:
            return None
        except OSError:  # no hard links here (some FUSE and SMB mounts)
            return self._create_exclusive(data)
        finally:
            os.unlink(temporary)
        return hashlib.sha256(data).hexdigest()

    def _create_exclusive(self, data: bytes) -> str | None:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return hashlib.sha256(data).hexdigest()

    def _aside(self) -> str:
        """A name of this request's own beside the lock, hidden and temporary (a folder's listing skips it)."""
        return os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.{uuid.uuid4().hex}.tmp")

    def _take(self, version: str) -> str | None:
        """Move the lock at `version` aside (one rename wins): that name, or None when it was another's."""
        aside = self._aside()
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return None
        with open(aside, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == version:
                return aside
        try:  # another run's newer lock: put back unless a third one took the place meanwhile
            os.link(aside, self.path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return None

    def replace(self, data: bytes, version: str) -> str | None:
        """Checked, then swapped in by rename: the lock is never absent (a starting run could take it then).
        Between the check and the rename only the take-over of a lock whose heartbeat is stale can come,
        which a heartbeat every `HEARTBEAT_S` rules out unless this process stood still for `STALE_AFTER_S`."""
        if self.read()[1] != version:
            return None
        temporary = self._aside()
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, self.path)
        return hashlib.sha256(data).hexdigest()

    def delete(self, version: str) -> bool:
        aside = self._take(version)
        if aside is not None:
            os.unlink(aside)
        return aside is not None


class S3LockFile:
    """A lock on S3 (AWS, MinIO, Ceph, moto): PUT with `If-None-Match: *` creates it, PUT and DELETE with
    `If-Match: <ETag>` change it; pyarrow sends no conditional requests, boto3 does. The endpoint and
    credentials come from the same environment pyarrow reads (AWS_ENDPOINT_URL, AWS_PROFILE, ...). boto3's
    errors become OSErrors with its words, as pyarrow's are, so that callers tell storage errors apart once."""

    REFUSED = ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "412", "409")

    def __init__(self, fs: pafs.S3FileSystem, path: str) -> None:
        self.bucket, _, self.key = path.partition("/")
        self.client = s3_client(fs)

    def beside(self, key: str) -> "S3LockFile":
        """The same requests, through the same client, on another key of the bucket (the store's probe)."""
        other = S3LockFile.__new__(S3LockFile)
        other.bucket, other.key, other.client = self.bucket, key, self.client
        return other

    def _request(self, name: str, **kwargs: object) -> dict | None:
        """One request; None when its condition did not hold (or the lock is absent)."""
        from botocore.exceptions import ClientError

        with boto_errors(f"s3://{self.bucket}/{self.key}"):
            try:
                return getattr(self.client, name)(Bucket=self.bucket, Key=self.key, **kwargs)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") in self.REFUSED:
                    return None
                raise

    def read(self) -> tuple[bytes | None, str | None]:
        got = self._request("get_object")
        return (None, None) if got is None else (got["Body"].read(), got["ETag"])

    def create(self, data: bytes) -> str | None:
        put = self._request("put_object", Body=data, IfNoneMatch="*")
        return None if put is None else put["ETag"]

    def replace(self, data: bytes, version: str) -> str | None:
        put = self._request("put_object", Body=data, IfMatch=version)
        return None if put is None else put["ETag"]

    def delete(self, version: str) -> bool:
        return self._request("delete_object", IfMatch=version) is not None


PROBE_PREFIX = "._lock.probe-"  # a hidden temporary name (".*.tmp"), which listings of the folder skip
_proven: dict[str, str | None] = {}  # endpoint -> why its store cannot hold the lock, None when it can
_proving = threading.Lock()


def _not_implemented(exc: OSError) -> bool:
    text = str(exc)
    return "NotImplemented" in text or "(501)" in text or "501 " in text


def probe_store(lock: S3LockFile, key: str) -> str | None:
    """Send each conditional request the lock uses to `key` (a fresh object): why the store cannot hold the lock
    (a condition it ignored or a request it does not take), or None when it refused what it had to. The object
    is deleted afterwards, whatever the store did."""
    probe = lock.beside(key)
    first = b"dscore lock probe 1"
    stale = f'"{hashlib.md5(b"dscore lock probe, a version never written").hexdigest()}"'  # noqa: S324 - an ETag
    try:
        try:
            if probe.create(first) is None:
                return f"it refused PUT with If-None-Match: * of a new object ({key})"
            if probe.create(b"dscore lock probe 2") is not None:
                return "it ignores If-None-Match: * on PUT (an object that exists was created again)"
            if probe.replace(b"dscore lock probe 3", stale) is not None:
                return "it ignores If-Match on PUT (an object was replaced at an ETag it never had)"
            if probe.delete(stale):
                return "it ignores If-Match on DELETE (an object was deleted at an ETag it never had)"
            data, version = probe.read()
            if data != first:
                return "it ignores If-Match (an object changed under a request at an ETag it never had)"
            if not probe.delete(version):
                return "it refused DELETE with If-Match at an object's own ETag"
        except OSError as exc:
            if _not_implemented(exc):
                return f"it does not take a conditional request the lock needs ({storage_cause(exc)})"
            raise
    finally:
        with contextlib.suppress(Exception):  # noqa: BLE001 - a probe left behind is hidden and harmless
            lock.client.delete_object(Bucket=lock.bucket, Key=key)
    return None


def prove_store(out: OutputDir, lock: S3LockFile) -> str | None:
    """Why the store behind `out` cannot hold the lock, or None: probed once per endpoint and process
    (`probe_store`, on a probe object under `out`)."""
    endpoint = lock.client.meta.endpoint_url
    with _proving:
        if endpoint not in _proven:
            key = posixpath.join(posixpath.dirname(lock.key), f"{PROBE_PREFIX}{uuid.uuid4().hex}.tmp")
            _proven[endpoint] = probe_store(lock, key)
        return _proven[endpoint]


class UnsafeLockFile:
    """`--unsafe-lock` on a store without conditional requests: check, then write (two runs starting at
    the same instant can both get in)."""

    def __init__(self, out: OutputDir) -> None:
        self.out = out
        self.path = out.path(LOCK_FILE)

    def read(self) -> tuple[bytes | None, str | None]:
        try:
            with self.out.fs.open_input_stream(self.path) as stream:
                data = stream.read()
        except FileNotFoundError:
            return None, None
        return data, hashlib.sha256(data).hexdigest()

    def create(self, data: bytes) -> str | None:
        if self.read()[0] is not None:
            return None
        with self.out.fs.open_output_stream(self.path) as stream:
            stream.write(data)
        return hashlib.sha256(data).hexdigest()

    def replace(self, data: bytes, version: str) -> str | None:
        if self.read()[1] != version:
            return None
        with self.out.fs.open_output_stream(self.path) as stream:
            stream.write(data)
        return hashlib.sha256(data).hexdigest()

    def delete(self, version: str) -> bool:
        if self.read()[1] != version:
            return False
        self.out.fs.delete_file(self.path)
        return True


def lock_file(out: OutputDir, prove: bool = False) -> LockFile:
    """The lock of `out` on its store; a store that cannot change it conditionally is refused in one line
    unless `--unsafe-lock` is given. `prove`: before taking it, check that an S3 store keeps the conditions
    (`prove_store`); one that does not is refused likewise."""
    if isinstance(out.fs, pafs.LocalFileSystem):
        return LocalLockFile(out.path(LOCK_FILE))
    if isinstance(out.fs, pafs.S3FileSystem):
        lock = S3LockFile(out.fs, out.path(LOCK_FILE))
        why = prove_store(out, lock) if prove else None
        if why is None:
            return lock
        if os.environ.get(UNSAFE_LOCK_ENV):
            logger.warning(
                "%s: the store at %s cannot hold the lock: %s; --unsafe-lock: checking, then writing it",
                out.uri,
                lock.client.meta.endpoint_url,
                why,
            )
            return UnsafeLockFile(out)
        raise UnsafeStoreError(
            f"--output {out.uri}: the store at {lock.client.meta.endpoint_url} cannot hold dscore's lock: {why}, so "
            "two runs could both write the folder; use a store that keeps conditional requests (AWS S3, MinIO, "
            f"Ceph RGW, SeaweedFS), or pass --unsafe-lock ({UNSAFE_LOCK_ENV}=1) if you make sure that no two runs "
            "write this folder at once"
        )
    if os.environ.get(UNSAFE_LOCK_ENV):
        return UnsafeLockFile(out)
    raise FolderLockedError(
        f"--output {out.uri}: dscore cannot lock a folder on {out.fs.type_name} so that two runs never both hold "
        "it (this store takes no create-if-absent request from dscore); write to a local or shared filesystem or "
        "s3://, or pass --unsafe-lock if you make sure that no two runs write this folder at once"
    )


class FolderLock:
    """The lock of one run on `out`; a context manager: taken on entry, released on exit."""

    def __init__(self, out: OutputDir, heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S) -> None:
        self.out = out
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.holder: Holder | None = None
        self.lost = False  # the lock was taken by another run while this one held it (its heartbeat found out)
        self._file: LockFile | None = None
        self._version: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._releasing = threading.Lock()

    def __enter__(self) -> "FolderLock":
        try:
            self.acquire()
        except BaseException:  # a signal the moment the lock was created (`stopping.deferred`): not left behind
            self.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise `FolderLockedError` naming the holder; a storage error is one line too."""
        now = time.time()
        holder = Holder(socket.gethostname(), os.getpid(), current_pid_namespace(), now, now, uuid.uuid4().hex)
        try:
            self._file = lock_file(self.out, prove=True)
            with self.out.writing():
                if isinstance(self.out.fs, pafs.LocalFileSystem):  # an object store has no folders to make
                    self.out.fs.create_dir(self.out.root, recursive=True)
            with stopping.deferred():  # created and noted as held, or neither
                self._version = self._file.create(holder.encoded())
                if self._version is None:
                    self._version = self._take_over(holder)
                self.holder = holder
                stopping.at_deadline(self.release)
        except OSError as exc:
            raise storage_error(self.out.uri, exc, "lock the output folder") from exc
        self._thread = threading.Thread(target=self._beat, daemon=True, name="dscore-lock-heartbeat")
        self._thread.start()

    def _take_over(self, holder: Holder) -> str:
        """Take over a left-over lock (its holder killed, or its heartbeat stale), only at the version read:
        of two runs taking over the same lock one gets it; else refuse, naming the holder."""
        data, version = self._file.read()
        previous = _holder(data)
        if previous is None:  # released between our attempt and the read: a run was just there
            raise FolderLockedError(f"{self.out.uri} was locked by another run a moment ago; try again")
        why = "which no longer exists" if previous.killed() else previous.stale_because(time.time(), self.stale_after_s)
        if why is None:
            raise FolderLockedError(
                f"{self.out.uri} is in use by another run: {previous.describe()}; wait for it to finish, or use "
                "another --output"
            )
        if self._file.delete(version):
            created = self._file.create(holder.encoded())
            if created is not None:
                logger.warning(
                    "%s/%s was left by %s, %s; taking the folder over",
                    self.out.uri,
                    LOCK_FILE,
                    previous.describe(),
                    why,
                )
                return created
        raise FolderLockedError(f"{self.out.uri} was taken over by another run a moment ago; try again")

    def _beat(self) -> None:
        """Refresh the heartbeat until released. A lock taken over by someone else is reported, not fought;
        a failed request (a storage outage) is logged and the next beat tries again."""
        while not self._stop.wait(self.heartbeat_s):
            beat = Holder(**{**asdict(self.holder), "heartbeat": time.time()})
            try:
                version = self._file.replace(beat.encoded(), self._version)
            except Exception as exc:  # noqa: BLE001 - any failed request: the heartbeat must outlive it
                logger.warning("the heartbeat of %s/%s failed (%s); trying again", self.out.uri, LOCK_FILE, exc)
                continue
            if version is None:
                self.lost = True
                logger.error(
                    "%s/%s was removed or taken by another run while this run was writing", self.out.uri, LOCK_FILE
                )
                return
            self.holder, self._version = beat, version

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it is still this run's (once: the unwinding of a stopped
        run and its deadline may both ask)."""
        with self._releasing:
            if self.holder is None:
                return
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.holder = None
            stopping.forget(self.release)
            if not self.lost:
                self._delete()

    def _delete(self) -> None:
        try:
            self._file.delete(self._version)
        except OSError as exc:  # never raised over the error that ended the run, if one did
            logger.error(
                "could not delete the lock %s/%s (%s): a rerun on any host takes it over once its heartbeat is "
                "%.0f s old, or delete it if no run uses the folder",
                self.out.uri,
                LOCK_FILE,
                storage_cause(exc),
                self.stale_after_s,
            )
