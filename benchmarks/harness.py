"""What a long measuring harness needs (scale.py, threads.py): a journal of finished measurements that
a rerun skips, child processes with a timeout and progress lines, and killing a child with every
process it started.

A measurement that runs in a child process has its own peak memory and cannot leave state behind in the
harness; when it overruns its timeout, its whole process tree is killed (an embedded Ray's GCS, raylet
and workers included) so that the next measurement starts on a quiet machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HEARTBEAT_S = 60.0  # how often a long measurement prints its last progress line


# The journal: one JSON line per finished measurement.


def load_journal(path: Path) -> dict[str, dict]:
    """The last record of every measurement key in the journal (a cut-off last line is ignored)."""
    records: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[record["key"]] = record
    return records


def is_finished(record: dict | None, timeout_s: float) -> bool:
    """Whether a measurement needs no rerun: it succeeded, or timed out under a timeout at least as long as
    this one (a skipped one is tried again: the disk may have room now)."""
    if record is None:
        return False
    if record["status"] == "ok":
        return True
    return record["status"] == "timeout" and record["timeout_s"] >= timeout_s


def append_journal(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


# Processes: children with a timeout, and killing a run with everything it started.


def child_environment() -> dict[str, str]:
    """This environment with the repository and benchmarks/ first on PYTHONPATH: a child, and the Ray
    workers it starts (they inherit Ray's environment), import the harnesses' modules by name."""
    env = dict(os.environ)
    paths = [str(HERE), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def spawn(script: Path, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python script argv` in a session of its own (`env` added to `child_environment`), its output
    appended to `log_path`."""
    log = log_path.open("a")
    try:
        return subprocess.Popen(
            [sys.executable, str(script), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**child_environment(), **(env or {})},
            cwd=ROOT,
        )
    finally:
        log.close()


def kill_tree(pid: int) -> None:
    """SIGKILL a process, every process descended from it and its process group (an embedded Ray's GCS,
    raylet and workers put themselves in other groups), then wait until they are gone. The process
    itself is killed first, as soon as its descendants are known: a run must stop where it stands."""
    import psutil

    try:
        root = psutil.Process(pid)
        descendants = root.children(recursive=True)
        root.kill()
    except psutil.NoSuchProcess:
        root, descendants = None, []
    group = [p for p in psutil.process_iter() if _group(p) == pid]
    everyone = list({p.pid: p for p in [*descendants, *group]}.values())
    for process in everyone:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(everyone + ([root] if root else []), timeout=30)


def _group(process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


def last_line(path: Path) -> str:
    """The log's last non-empty line (a progress line, usually), shortened."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][-160:] if lines else ""


def wait_child(process: subprocess.Popen, timeout_s: float, log_path: Path, label: str) -> str:
    """'ok', 'failed' or 'timeout' (the child's tree killed); prints the child's last log line every
    HEARTBEAT_S meanwhile. Interrupted (Ctrl-C reaches only this process: the child has its own
    session), it kills the child's tree before giving up."""
    started = time.monotonic()
    beat = started + HEARTBEAT_S
    try:
        while True:
            try:
                return "ok" if process.wait(timeout=1.0) == 0 else "failed"
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now - started > timeout_s:
                    kill_tree(process.pid)
                    return "timeout"
                if now >= beat:
                    beat = now + HEARTBEAT_S
                    print(f"      ... {label}: {duration(now - started)}: {last_line(log_path)}", flush=True)
    except BaseException:
        kill_tree(process.pid)
        raise
