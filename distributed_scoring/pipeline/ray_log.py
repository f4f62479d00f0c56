"""Ray's own messages kept off the terminal while a run's embedded or joined Ray is up, and in a log file.

Beside the run's own lines, Ray prints lines that look like failures and are not: its token-authentication
notice, Ray Data's execution plan, progress bars and advice, and an error-level `core_worker.cc ...
constructor arguments in the object store` line that every Ray Data actor pool triggers
(ray-project/ray#57733). Its Python loggers (`ray`, `ray.data`) are handed to a handler that writes the
run log instead of the terminal; its C++ core writes straight to file descriptor 2, so while the run
lasts that descriptor is a pipe whose lines in Ray's C++ log format go to the run log and everything
else (this package's log lines, the progress bar, tracebacks) to where it went before. The run log is
`dscore-driver-<pid>.log` in the Ray session's log folder, beside the logs of Ray's workers; lines that
come before Ray has made that folder are held until then.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import threading
from typing import IO, Iterator

RAY_LOGGERS = ("ray", "ray.data")
# `[2026-11-24 22:44:27,107 E 10320 10589] core_worker.cc:2465: ...` (Ray's own C++ log lines), and
# `E1124 22:44:27.107000  10320 file.cc:12] ...` (absl/glog lines of the libraries it links).
CORE_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] "
                       rb"|[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
_DECIDE_AFTER = 64  # bytes of a line enough to tell whether it is a core line
_CORE_STARTS = (b"[", b"D", b"I", b"W", b"E", b"F")  # a line starting otherwise is routed at once
_ENDS = re.compile(rb"[\r\n]")


class RunLog:
    """A log file written line by line from any thread, holding its lines until `open` names the file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._file: IO[str] | None = None
        self.path: str | None = None

    def write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                self._held.append(text)
            else:
                self._file.write(text)
                self._file.flush()

    def open(self, path: str) -> None:
        with self._lock:
            self._file = open(path, "a", encoding="utf-8", errors="replace")
            self._file.writelines(self._held)
            self._file.flush()
            self._held, self.path = [], path

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _ToRunLog(logging.Handler):
    def __init__(self, log: RunLog) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(name)s: %(message)s"))
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never raise into Ray's code
            self.handleError(record)


def split_core_lines(data: bytes, deciding: bytes,
                     to_log: bool | None) -> tuple[list[tuple[bool, bytes]], bytes, bool | None]:
    """Route a chunk of file descriptor 2's bytes: ([(to the log?, bytes)], bytes still undecided, how
    the current line is routed (None at a line's start)). A line (ended by a newline or a carriage
    return, as a progress bar redraws) is routed by its start, held until enough of it has come."""
    out: list[tuple[bool, bytes]] = []
    data = deciding + data
    while data:
        if to_log is None:
            ended = _ENDS.search(data, 0, _DECIDE_AFTER)
            if ended is None and len(data) < _DECIDE_AFTER and data[:1] in _CORE_STARTS:
                return out, data, None
            to_log = CORE_LINE.match(data) is not None
        ended = _ENDS.search(data)
        cut = len(data) if ended is None else ended.end()
        out.append((to_log, data[:cut]))
        data = data[cut:]
        if ended is not None:
            to_log = None
    return out, b"", to_log


class _CoreLinesToLog:
    """File descriptor 2 through a pipe: Ray's C++ log lines to the run log, the rest to the old fd 2."""

    def __init__(self, log: RunLog) -> None:
        self.log = log

    def __enter__(self) -> None:
        sys.stderr.flush()
        self.saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self.thread = threading.Thread(target=self._pump, args=(read, os.dup(self.saved)), daemon=True,
                                       name="dscore-stderr")
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)  # the pipe's last writer gone, the pump reads to its end and stops
        os.close(self.saved)
        self.thread.join(timeout=5)

    def _pump(self, read: int, terminal: int) -> None:
        deciding, to_log = b"", None
        try:
            while chunk := os.read(read, 1 << 16):
                routed, deciding, to_log = split_core_lines(chunk, deciding, to_log)
                for logged, data in routed:
                    if logged:
                        self.log.write(data.decode("utf-8", "replace"))
                    else:
                        os.write(terminal, data)
            if deciding:
                os.write(terminal, deciding)
        finally:
            os.close(read)
            os.close(terminal)


@contextlib.contextmanager
def ray_output_to(log: RunLog) -> Iterator[None]:
    """While the body runs, Ray's log records and its C++ lines go to `log`, not to the terminal; this
    package's records go to both. Everything is put back as it was on exit."""
    importlib.import_module("ray.data")  # Ray Data sets its loggers up when imported: now, not over ours

    handler = _ToRunLog(log)
    replaced: dict[str, list[logging.Handler]] = {}
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        replaced[name] = [h for h in logger.handlers
                          if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        for h in replaced[name]:
            logger.removeHandler(h)
        logger.addHandler(handler)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with _CoreLinesToLog(log):
            yield
    finally:
        root.removeHandler(handler)
        for name, handlers in replaced.items():
            logger = logging.getLogger(name)
            logger.removeHandler(handler)
            for h in handlers:
                logger.addHandler(h)
        log.close()
