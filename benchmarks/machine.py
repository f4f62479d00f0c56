"""What a benchmark ran on: CPU or GPU, threads, and the versions of the libraries that decide speed.

Imported by the harnesses and by the minicons worker (which runs in its own virtual environment), so
it needs nothing beyond the standard library and torch.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib import metadata
from typing import Callable


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe(packages: tuple[str, ...] = ("torch", "transformers", "tokenizers", "numpy")) -> dict:
    """The machine and this environment: CPU, logical cores, torch threads, GPU, package versions."""
    import torch

    info = {
        "cpu": cpu_name(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "versions": {p: version(p) for p in packages},
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def set_threads(threads: int) -> None:
    """The same intra-op thread count for torch and for the libraries that read it from the environment.

    Set the environment before torch starts its pools, so child processes inherit the same count.
    """
    import torch

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_RS_NUM_CPUS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def start(threads: int, warn_busy: bool = True) -> float:
    """A benchmark's start: logging, torch threads, quiet transformers; returns the load average, with a
    warning when other work is running (timings would be disturbed)."""
    import logging

    from distributed_scoring.quiet import quiet_transformers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    set_threads(threads)
    quiet_transformers()
    load = os.getloadavg()[0]
    if load > 0.5 and warn_busy:
        logging.getLogger("benchmarks").warning(
            "load average %.1f before the start: other work is running, timings will be disturbed", load
        )
    return load
