"""Ray's own messages kept off the terminal while a run's embedded or joined Ray is up, and in a log file.

Beside the run's own lines, Ray prints lines that look like failures and are not: its token-authentication
notice, Ray Data's execution plan, progress bars and advice, and an error-level `core_worker.cc ...
constructor arguments in the object store` line that every Ray Data actor pool triggers
(ray-project/ray#57733); and under memory pressure, its out-of-memory killer's `(raylet) ... retried`
notices (which the driver prints even with `log_to_driver` off) and `ERROR services.py` lines of its
processes. Its Python loggers (`ray`, `ray.data`) are handed to a handler that writes the run log instead
of the terminal, and so are the Python warnings raised in its code; its C++ core and its other processes
write straight to file descriptor 2, so while the run lasts that descriptor is a pipe whose lines in Ray's
formats (its C++ log lines, anywhere in a line; its Python log lines and `(raylet)` notices, at a line's
start) go to the run log and everything else
(this package's log lines, the progress bar, tracebacks) to where it went before. The run log is
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
import tempfile
import threading
import warnings
from typing import IO, Iterator

RAY_LOGGERS = ("ray", "ray.data")
# Ray's own C++ log lines, `[2026-11-24 22:44:27,107 E 10320 10589] core_worker.cc:2465: ...`, written
# whole, also right after a progress bar's text that has no line end yet; and at a line's start the
# absl/glog lines of the libraries it links, `E1124 22:44:27.107000  10320 file.cc:12] ...`.
RAY_CORE_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] ")
ABSL_LINE = re.compile(rb"[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
# Ray's Python log format, `2026-11-24 22:44:27,107<TAB>ERROR services.py:1234 -- ...` (a tab after the time,
# a file name: this package's lines have a space and a logger name), and the messages the driver prints for
# the raylet, `(raylet) Task ... was killed ... retried`, in yellow on a terminal.
RAY_PYTHON_LINE = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t[A-Z]+ [\w.-]+\.py:\d+ -- ")
RAYLET_LINE = re.compile(rb"(?:\x1b\[\d+m)?\(raylet[,)]")
_LINE_STARTS = (RAY_CORE_LINE, ABSL_LINE, RAY_PYTHON_LINE, RAYLET_LINE)
# Their beginnings, one byte each: d a digit, X a severity letter, anything else itself.
_STARTS = (b"[dddd-dd-dd dd:dd:dd,", b"Xdddd dd:dd:dd.", b"dddd-dd-dd dd:dd:dd,", b"(raylet", b"\x1b[33m(raylet")
# What is also found in the middle of a line (written right after a progress bar's text, which has no line
# end until the bar closes), and its beginnings.
_MID_LINE = re.compile(RAY_CORE_LINE.pattern + b"|" + RAYLET_LINE.pattern)
_MID_STARTS = (_STARTS[0], _STARTS[3], _STARTS[4])
_ENOUGH = 64  # bytes that always tell whether a line is a core line
_ENDS = re.compile(rb"[\r\n]")
# The lines that continue a message of Ray's over several (a `(raylet) ... Error: Traceback` notice, an actor's
# creation error): blank or indented lines, a traceback's headings, its closing `package.SomeError: ...` (a
# bare `Error: ...` may be this package's own message and stays on the terminal). They
# go where the line before them went; `AFTER_RAY` is the state at the start of a line that follows Ray's.
_CONTINUATION = re.compile(
    rb"\r?\n|[ \t]|Traceback \(most recent call last\)|During handling of the above|The above exception"
    rb"|(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*(?:Error|Exception|Exit)(?::|\r?\n)"
)
AFTER_RAY = "after a line of Ray's"


def _may_start(tail: bytes, template: bytes) -> bool:
    """Whether `tail` (shorter than _ENOUGH) may be the beginning of a line of `template`'s kind."""
    classes = {ord("d"): b"0123456789", ord("X"): b"DIWEF"}
    return bool(tail) and all(c in classes.get(t, bytes([t])) for c, t in zip(tail, template))


def run_log_path(context: object) -> str:
    """`dscore-driver-<pid>.log` in the log folder of the Ray session `context` (what `ray.init` returns)
    belongs to; in the temporary folder for a Ray Client driver (`ray://`), whose session folder is on the
    cluster."""
    session = getattr(context, "address_info", {}).get("session_dir")
    folder = os.path.join(session, "logs") if session else tempfile.gettempdir()
    return os.path.join(folder, f"dscore-driver-{os.getpid()}.log")


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

    def close(self) -> str:
        """Closes the file; returns the lines held for one that was never opened (Ray failed to start)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            held, self._held = "".join(self._held), []
            return held


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


def split_core_lines(
    data: bytes, held: bytes, to_log: bool | str | None
) -> tuple[list[tuple[bool, bytes]], bytes, bool | str | None]:
    """Route a chunk of file descriptor 2's bytes: ([(to the log?, bytes)], bytes held back until more
    come, how the current line is routed: None at a line's start, `AFTER_RAY` at the start of a line after
    one of Ray's). Lines end at a newline or at a carriage return (a progress bar redraws itself after one)."""
    out: list[tuple[bool, bytes]] = []
    data = held + data
    while data:
        ended = _ENDS.search(data)
        stop = len(data) if ended is None else ended.end()
        if to_log is None or to_log == AFTER_RAY:
            after = to_log == AFTER_RAY
            if ended is None and len(data) < _ENOUGH and (after or any(_may_start(data, t) for t in _STARTS)):
                return out, data, to_log
            to_log = any(pattern.match(data) for pattern in _LINE_STARTS) or (
                after and _CONTINUATION.match(data) is not None
            )
        if not to_log:
            core = _MID_LINE.search(data, 0, stop)
            if core is not None:
                stop, ended = core.start(), None
            elif ended is None:
                window = max(0, len(data) - _ENOUGH)
                marks = [m for t in _MID_STARTS if (m := data.rfind(t[:1], window)) >= 0 and _may_start(data[m:], t)]
                if marks:
                    mark = min(marks)
                    stop, data, held = mark, data[:mark], data[mark:]
                    out += [(False, data)] if data else []
                    return out, held, False
        if stop:
            out.append((to_log, data[:stop]))
        data = data[stop:]
        if ended is not None:
            to_log = AFTER_RAY if to_log else None
        elif data:
            to_log = True  # a line of Ray's starts here, in the middle of another line
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
        self.thread = threading.Thread(
            target=self._pump, args=(read, os.dup(self.saved)), daemon=True, name="dscore-stderr"
        )
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)  # the pipe's last writer gone, the pump reads to its end and stops
        os.close(self.saved)
        self.thread.join(timeout=5)

    def _pump(self, read: int, terminal: int) -> None:
        """Reads the pipe to its end whatever happens to the terminal: a pipe left full would block every
        writer to file descriptor 2, this process's threads and Ray's alike."""
        deciding, to_log = b"", None
        try:
            while chunk := os.read(read, 1 << 16):
                routed, deciding, to_log = split_core_lines(chunk, deciding, to_log)
                for logged, data in routed:
                    if logged:
                        self.log.write(data.decode("utf-8", "replace"))
                    else:
                        _write_all(terminal, data)
            _write_all(terminal, deciding)
        finally:
            os.close(read)
            os.close(terminal)


def _write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, or what it takes until the terminal is gone (then it is dropped)."""
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


@contextlib.contextmanager
def _ray_warnings_to(log: RunLog) -> Iterator[None]:
    """Python warnings raised in Ray's own code (Ray Data's advice on actor pools that got fewer inputs
    than actors, say) go to `log`; other warnings are shown as before."""
    import ray

    ray_code = os.path.dirname(ray.__file__) + os.sep
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 - warnings' signature
        if str(filename).startswith(ray_code):
            log.write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


@contextlib.contextmanager
def ray_output_to(log: RunLog, ray_data: bool = True) -> Iterator[None]:
    """While the body runs, Ray's log records and its C++ lines go to `log`, not to the terminal; this
    package's records go to both. Everything is put back as it was on exit. `ray_data`: the body may use Ray
    Data, which sets its loggers up when imported, so it is imported now, not over ours; a body that never
    does (`dscore submit`) is spared its import, seconds on a busy machine before the command's first line."""
    if ray_data:
        importlib.import_module("ray.data")

    handler = _ToRunLog(log)
    replaced: dict[str, list[logging.Handler]] = {}
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        replaced[name] = [
            h
            for h in logger.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        ]
        for h in replaced[name]:
            logger.removeHandler(h)
        logger.addHandler(handler)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with _CoreLinesToLog(log), _ray_warnings_to(log):
            yield
    finally:
        root.removeHandler(handler)
        for name, handlers in replaced.items():
            logger = logging.getLogger(name)
            logger.removeHandler(handler)
            for h in handlers:
                logger.addHandler(h)
        sys.stderr.write(log.close())  # had Ray failed to start, what it said would be lost otherwise
