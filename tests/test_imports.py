"""The driver never imports torch: importing any module but the engines leaves `torch` out of
`sys.modules`, so drivers start fast and heavy imports happen on the actors that score.

Each module is imported in a fresh interpreter (this test process may already hold torch).
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import distributed_scoring

# Modules that are torch code themselves, imported only where a model runs (actors, in-process scoring).
ENGINES = {"causal", "conditionals", "joints", "models", "pll", "scorer"}
DRIVER_MODULES = sorted(m.name for m in pkgutil.iter_modules(distributed_scoring.__path__) if m.name not in ENGINES)
ROOT = Path(__file__).resolve().parents[1]


def _imports_torch(statement: str) -> bool:
    code = f"import sys\n{statement}\nprint('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] == "True"


def test_the_workflow_modules_are_all_checked():
    assert {"cli", "runner", "pipeline", "rescore_run", "joints_run", "snapshot", "audit", "antibodies",
            "verify"} <= set(DRIVER_MODULES)


@pytest.mark.parametrize("module", DRIVER_MODULES)
def test_importing_a_driver_module_leaves_torch_out(module):
    assert not _imports_torch(f"import distributed_scoring.{module}")
