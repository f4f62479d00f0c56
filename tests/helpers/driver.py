"""Running a `dscore` driver as a subprocess in a test: a corpus for it, an environment in which it starts its own
Ray, and what to show when it fails. Used by the fault tests (tests/faults/) and the object-storage tests."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import tiny
from helpers.local_cluster import REPO


def make_corpus(folder: Path, n_lines: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "many.txt"
    path.write_text("\n".join(tiny.CORPUS[i % len(tiny.CORPUS)] for i in range(n_lines)) + "\n")
    return str(path)


def why(stderr: str) -> str:
    """A failed run's first error lines, then the end of its stderr (which may be only Ray's shutdown)."""
    errors = [line for line in stderr.splitlines() if "dscore: " in line or " ERROR " in line or "Error" in line]
    return "\n".join(errors[:10]) + "\n...\n" + stderr[-2000:]


def embedded_env() -> dict:
    """A driver that starts its own Ray: never the test session's, nor a cluster left in the shell."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DSCORE_RAY_ADDRESS")}
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
