"""One module per workload: its options dataclass (what changes its rows), its output schema and its
prepare and score stages. Engines are imported inside the stages, on the actors, never on the driver.

The registry is this folder: a workload's module declares itself (`DECLARED`, a
`pipeline.workload.Declaration`), and `registered` finds every declaration here, so adding a workload
edits no shared file. Modules that declare nothing hold shared stages (`prepare`, `masked`).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..pipeline.workload import Declaration


def registered() -> dict[str, Declaration]:
    """Every workload's declaration, by name (importing the workload modules: no torch)."""
    found: dict[str, Declaration] = {}
    for module in pkgutil.iter_modules(__path__):
        declared = getattr(importlib.import_module(f"{__name__}.{module.name}"), "DECLARED", None)
        if declared is None:
            continue
        assert declared.name not in found, f"two workloads declare the name {declared.name!r}"
        found[declared.name] = declared
    return found
