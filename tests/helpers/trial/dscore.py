"""Running `dscore` commands for the adversarial trial: each a real process with its own exit code, standard
streams, working directory and a pid to kill -9.

By default a command is `distributed_scoring.cli.main(argv)` in a process forked from this one after torch,
transformers and pyarrow are imported (only the seconds of imports are saved, so that the trial takes
minutes, not an hour, on 2 cores); `spawn` runs it as `python -m distributed_scoring.cli` instead, and
`inline` in this very process (no kills, no preludes). The `--ray` cases always spawn (an embedded Ray is
started by a fresh driver); the full-disk cases always fork (the full disk is a filesystem patched into
the child, tests/helpers/full_disk.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

TIMEOUT_S = 300.0  # one command; a run of a case's few rows takes seconds
RAY_TIMEOUT_S = 420.0
# What the trial's commands run under, set before torch is imported (tests/system/trial.py; this module
# imports no torch) or by the system tests' conftest: no downloads, one thread each, no usage reports.
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def set_environment() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


@dataclass
class Call:
    """One dscore command and what it did."""

    argv: list[str]
    rc: int | None  # None: killed by this trial
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        """The command's own lines on standard error: `dscore: error|incomplete: ...` or argparse's
        `dscore score: error: ...`."""
        return [line for line in self.err.splitlines() if line.startswith("dscore")]

    @property
    def line(self) -> str:
        return " / ".join(self.lines)

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    @property
    def shown(self) -> str:
        return "dscore " + shlex.join(self.argv)


class Process:
    """A started command: its pid, waited for or killed."""

    def __init__(self, argv: list[str], pid: int, popen: subprocess.Popen | None, out: Path, err: Path) -> None:
        self.argv, self.pid, self.popen, self.out_path, self.err_path = argv, pid, popen, out, err
        self.rc: int | None = None
        self.killed = False

    def poll(self) -> int | None:
        if self.rc is None:
            if self.popen is not None:
                self.rc = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.rc = os.waitstatus_to_exitcode(status)
        return self.rc

    def wait(self, timeout_s: float) -> Call:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(0.05)
        return self.call()

    def kill(self) -> None:
        """kill -9, then reap."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.killed = True
        if self.popen is not None:
            self.popen.wait()
        elif self.rc is None:
            os.waitpid(self.pid, 0)
        self.rc = None

    def call(self) -> Call:
        read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
        return Call(self.argv, None if self.killed else self.rc, read(self.out_path), read(self.err_path))


Prelude = Callable[[], None]


class Dscore:
    """Runs dscore commands in a case's folder: forked from this process (`fork`), as `python -m
    distributed_scoring.cli` (`spawn`), or in this very process (`inline`: the test's fast subset; no
    kills, no preludes)."""

    def __init__(self, mode: str = "fork") -> None:
        assert mode in ("fork", "spawn", "inline")
        self.mode = mode
        self.count = 0

    def start(
        self,
        argv: Sequence[str],
        cwd: Path,
        spawn: bool = False,
        prelude: Prelude | None = None,
        env: dict[str, str] | None = None,
    ) -> Process:
        argv = [str(a) for a in argv]
        self.count += 1
        logs = cwd / "_logs"
        logs.mkdir(parents=True, exist_ok=True)
        out, err = logs / f"{self.count:03d}.out", logs / f"{self.count:03d}.err"
        if (spawn or self.mode == "spawn") and prelude is None:
            from helpers.driver import embedded_env  # (torch: not before set_environment)

            with out.open("wb") as o, err.open("wb") as e:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "distributed_scoring", *argv],
                    cwd=cwd,
                    stdout=o,
                    stderr=e,
                    env={**embedded_env(), **(env or {})},
                    start_new_session=True,
                )
            return Process(argv, popen.pid, popen, out, err)
        assert self.mode != "inline", "the inline runner runs commands to their end: use call()"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: dscore's main with this case's folder and files, then exit with its code
            rc = 1
            try:
                os.setsid()
                os.chdir(cwd)
                os.environ.update(env or {})
                for fd, path in ((1, out), (2, err)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                # A fresh process's streams and logging, whatever this one had (pytest's capture and handlers)
                sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
                for handler in logging.root.handlers[:]:
                    logging.root.removeHandler(handler)
                if prelude is not None:
                    prelude()
                from distributed_scoring.cli import main

                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # what `python -m` would print
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(rc)
        return Process(argv, pid, None, out, err)

    def call(self, argv: Sequence[str], cwd: Path, timeout_s: float = TIMEOUT_S, **kwargs) -> Call:
        if self.mode == "inline" and not kwargs.get("spawn"):
            return self._inline([str(a) for a in argv], cwd)
        return self.start(argv, cwd, **kwargs).wait(RAY_TIMEOUT_S if "--ray" in argv else timeout_s)

    @staticmethod
    def _inline(argv: list[str], cwd: Path) -> Call:
        from distributed_scoring.cli import main

        out, err = io.StringIO(), io.StringIO()
        here = os.getcwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(argv)
                except SystemExit as exc:
                    rc = exc.code if isinstance(exc.code, int) else 1
                except Exception:
                    traceback.print_exc()
                    rc = 1
        finally:
            os.chdir(here)
        return Call(argv, rc, out.getvalue(), err.getvalue())


def full_disk(kind: str, n: int) -> Prelude:
    """In the child: the `n`-th file of `kind` ('shard', 'marker', 'run file') written into the output
    folder finds the disk full (tests/helpers/full_disk.py)."""

    def patch() -> None:
        from distributed_scoring.io import output

        from helpers.full_disk import full_disk_at

        disk = full_disk_at(kind, n)
        output.filesystem = lambda uri: (disk, str(Path(uri).resolve()))

    return patch


def descendants_of(pid: int) -> list:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def reap(processes: list, grace_s: float = 30.0) -> None:
    """The killed driver's processes (an embedded Ray's) end by themselves (its watchdog); any still there
    after `grace_s` is killed, so that the trial leaves nothing behind."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=10)
