"""The driver never imports torch: importing any module but the torch engines leaves `torch` out of
`sys.modules`, so drivers start fast and heavy imports happen on the actors that score.

Each module is imported in a fresh interpreter (this test process may already hold torch): one interpreter
imports the torch-free libraries every module uses (numpy, pyarrow) once, then forks a child per module
that imports it and reports, so each module is checked alone without paying a whole interpreter's start.

No module imports itself back through others (`test_no_import_circles`): a definition two modules need lives
in the one below both.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

import distributed_scoring
from distributed_scoring.workloads import registered

# Engine modules that are torch code themselves, imported only where a model runs (actors, in-process
# scoring): those the workloads declare, and the torch code no workload owns (the model loader every
# engine uses; training, which `dscore train` runs without a workload). The engine's torch-free modules
# (packing, masking, ...) are checked like every other module.
SHARED_ENGINES = {"engine.masked_lm", "engine.training"}
ENGINES = {engine for declared in registered().values() for engine in declared.engines} | SHARED_ENGINES
ALL_MODULES = sorted(
    m.name.removeprefix("distributed_scoring.")
    for m in pkgutil.walk_packages(distributed_scoring.__path__, "distributed_scoring.")
)
DRIVER_MODULES = [m for m in ALL_MODULES if m not in ENGINES]
ROOT = Path(__file__).resolve().parents[1]


def _imports_torch(statement: str) -> bool:
    code = f"import sys\n{statement}\nprint('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] == "True"


def test_the_workflow_modules_are_all_checked():
    assert ENGINES <= set(ALL_MODULES)
    assert {
        "cli",
        "workflows.score",
        "workflows.joints",
        "workflows.verify",
        "workflows.rescore.run",
        "workflows.audit.run",
        "pipeline.runner",
        "pipeline.on_ray",
        "workloads.pll",
        "workloads.causal",
        "workloads.joints",
        "offline.antibodies",
        "engine.packing",
        "api.scorer",
        "api.stages",
    } <= set(DRIVER_MODULES)


def test_the_python_api_is_imported_lazily_and_without_torch():
    """`from distributed_scoring import MLMScorer` loads the API on first use; the model (torch) only
    when a scorer is made."""
    assert not _imports_torch("import distributed_scoring\nassert 'distributed_scoring.api' not in sys.modules")
    assert not _imports_torch("from distributed_scoring import MLMScorer, PLLStage")


# Run by one interpreter: a forked child per module imports it and prints whether torch came with it (or
# the import's error); the parent has only the torch-free libraries below, checked before any fork.
FORKED_IMPORTS = """
import json, os, sys, traceback
import numpy, pyarrow, pyarrow.parquet
assert "torch" not in sys.modules
results = {}
for module in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            __import__("distributed_scoring." + module)
            out = "torch" in sys.modules
        except BaseException:
            out = traceback.format_exc()
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        results[module] = json.loads(f.read() or '"the child died without a word"')
    os.waitpid(pid, 0)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def driver_imports() -> dict:
    """module -> True (it imported torch), False, or the traceback of its failed import."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", FORKED_IMPORTS, *DRIVER_MODULES], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", DRIVER_MODULES)
def test_importing_a_driver_module_leaves_torch_out(module, driver_imports):
    outcome = driver_imports[module]
    assert outcome is False, outcome if isinstance(outcome, str) else f"importing {module} imports torch"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that module `name` imports anywhere (at module level, under `TYPE_CHECKING`,
    inside functions), relative imports resolved; `from a import b` is module `a.b` where that is one, else
    `a` (a package: its __init__)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            found |= {
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
            }
    return found & modules


def _import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, from the source of every module."""
    paths = {_module_name(path): path for path in (ROOT / "distributed_scoring").rglob("*.py")}
    return {name: _imported(name, path, set(paths)) for name, path in paths.items()}


def _paths_from(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """module -> the module before it on a shortest import path from `start` (breadth first)."""
    before: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imported in sorted(graph[module] - set(before)):
            before[imported] = module
            queue.append(imported)
    return before


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle of each strongly connected component of the graph that has one (more than one
    module, or a module importing itself)."""
    circles, seen = [], set()
    for start in sorted(graph):
        before = _paths_from(graph, start)
        if start in seen or start not in before:
            continue
        cycle = [start]
        while cycle[-1] != start or len(cycle) == 1:
            cycle.append(before[cycle[-1]])
        circles.append(cycle[::-1])
        seen |= {module for module in before if start in _paths_from(graph, module)}
    return circles


def test_no_import_circles():
    """No module reaches itself through the imports of the package's modules (module-level and
    function-level imports alike): each circle would be a definition in the wrong module."""
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in circles)
