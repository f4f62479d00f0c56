"""One run at a time per output folder: `DIR/_lock.json` names the run that holds the folder.

Two runs writing one folder would delete each other's temporary files and mix their shards. The lock
holds the host, pid (and pid namespace), start time and a heartbeat that a daemon thread on the driver
refreshes every `HEARTBEAT_S`; it is released (deleted) when the run ends, also on error. A second run
finds it and stops at once, naming the holder. Two kinds of left-over lock:

- the holder ran on this host, in this pid namespace, and its pid is gone: the run was killed
  (`kill -9`, out of memory), so the lock is taken over with a warning, and rerunning the same command
  resumes as it always did;
- the heartbeat is older than `STALE_AFTER_S` (a run on another host cannot be checked): reported as
  stale with how to clear it (delete the file), never broken silently, since that run may be paused.

`--overwrite` never breaks a lock. Local folders create the file atomically (O_EXCL); an object store
has no atomic create, so two runs starting within the same instant there can both get in: the heartbeat
makes such an overlap visible (the losing run logs that its lock was taken), not impossible.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import pyarrow.fs as pafs

from ..errors import UserError
from .output import LOCK_FILE, OutputDir

logger = logging.getLogger(__name__)

HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


class FolderLockedError(UserError):
    """Another run holds the output folder (or left a stale lock); the message says which and what to do."""


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
            return f"its heartbeat is {now - self.heartbeat:.0f} s old (stale after {stale_after_s:.0f} s)"
        return None


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


def read_holder(out: OutputDir) -> Holder | None:
    """The lock's holder, or None when the folder is not locked (an unreadable lock counts as held
    by an unknown run whose heartbeat is unknown: stale)."""
    try:
        data = out.read_json(LOCK_FILE)
    except ValueError:
        data = {}
    if data is None:
        return None
    try:
        return Holder(**data)
    except TypeError:
        return Holder("?", -1, None, 0.0, 0.0, "")


class FolderLock:
    """The lock of one run on `out`; a context manager: taken on entry, released on exit."""

    def __init__(self, out: OutputDir, heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S) -> None:
        self.out = out
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.holder: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise `FolderLockedError` naming the holder (and how to clear a stale one)."""
        now = time.time()
        holder = Holder(socket.gethostname(), os.getpid(), current_pid_namespace(), now, now, uuid.uuid4().hex)
        with self.out.writing():
            self.out.fs.create_dir(self.out.root, recursive=True)
            if not self._create(holder):
                self._take_over_killed(read_holder(self.out))
                if not self._create(holder):
                    self._refuse(read_holder(self.out))
        self.holder = holder
        self._thread = threading.Thread(target=self._beat, daemon=True, name="dscore-lock-heartbeat")
        self._thread.start()

    def _create(self, holder: Holder) -> bool:
        """Write the lock unless one exists: atomically on a local disk, check-then-write elsewhere."""
        path = self.out.path(LOCK_FILE)
        text = json.dumps(asdict(holder), indent=2, sort_keys=True).encode("utf-8")
        if isinstance(self.out.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(text)
            return True
        if read_holder(self.out) is not None:
            return False
        self.out.write_json(LOCK_FILE, asdict(holder))
        return True

    def _take_over_killed(self, holder: Holder | None) -> None:
        """Delete the lock of a killed run of this host (a rerun after `kill -9` resumes)."""
        if holder is None or not holder.killed():
            return
        logger.warning(
            "%s/%s was left by %s, which no longer exists; taking the folder over",
            self.out.uri,
            LOCK_FILE,
            holder.describe(),
        )
        current = read_holder(self.out)
        if current is not None and current.token == holder.token:
            self.out.fs.delete_file(self.out.path(LOCK_FILE))

    def _refuse(self, holder: Holder | None) -> None:
        lock = f"{self.out.uri}/{LOCK_FILE}"
        if holder is None:  # released between our attempt and the read: a run was just there
            raise FolderLockedError(f"{self.out.uri} was locked by another run a moment ago; try again")
        stale = holder.stale_because(time.time(), self.stale_after_s)
        if stale:
            raise FolderLockedError(
                f"{lock} is a stale lock of {holder.describe()}: {stale}; if no run is using the folder, "
                f"delete {lock} and run again"
            )
        raise FolderLockedError(
            f"{self.out.uri} is in use by another run: {holder.describe()}; wait for it to finish, or use another "
            "--output"
        )

    def _beat(self) -> None:
        """Refresh the heartbeat until released; a lock taken over by someone else is reported, not fought."""
        while not self._stop.wait(self.heartbeat_s):
            current = read_holder(self.out)
            if current is None or current.token != self.holder.token:
                logger.error(
                    "%s/%s was removed or taken by another run while this run was writing", self.out.uri, LOCK_FILE
                )
                return
            self.holder = Holder(**{**asdict(self.holder), "heartbeat": time.time()})
            self.out.write_json(LOCK_FILE, asdict(self.holder))

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it is still this run's."""
        if self.holder is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = read_holder(self.out)
        if current is not None and current.token == self.holder.token:
            self.out.fs.delete_file(self.out.path(LOCK_FILE))
        self.holder = None
