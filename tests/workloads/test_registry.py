"""Workloads declare themselves: what the code around a workload would otherwise
hard-code about it (its row key, its torch engines, its page) is declared once in its module, and the
registry finds every declaration in workloads/ without a list kept by hand."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest

import distributed_scoring.workloads as workloads
from distributed_scoring.pipeline.workload import Declaration, Workload
from distributed_scoring.workloads import registered

ROOT = Path(__file__).resolve().parents[2]
DECLARED = registered()


def test_every_module_that_builds_a_workload_declares_itself():
    """A module with a factory of `Workload`s is registered; one without (a shared stage) is not."""
    for module in pkgutil.iter_modules(workloads.__path__):
        found = importlib.import_module(f"{workloads.__name__}.{module.name}")
        factories = [
            name
            for name, f in inspect.getmembers(found, inspect.isfunction)
            if f.__module__ == found.__name__ and inspect.signature(f).return_annotation in (Workload, "Workload")
        ]
        declared = getattr(found, "DECLARED", None)
        assert bool(factories) == isinstance(declared, Declaration), (module.name, factories, declared)
        if declared is not None:
            assert DECLARED[declared.name] is declared
    assert {"pll", "chain", "causal", "maskless", "infill", "generate", "sample", "joints"} <= set(DECLARED)


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_a_declared_page_exists_and_documents_the_row_key(name):
    declared = DECLARED[name]
    page = ROOT / declared.docs
    assert page.is_file(), f"{name} declares {declared.docs}, which does not exist"
    text = page.read_text()
    for column in declared.row_key:
        assert f"`{column}`" in text, f"{declared.docs} does not describe {name}'s key column {column!r}"


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_declared_engines_are_engine_modules(name):
    for engine in DECLARED[name].engines:
        assert engine.startswith("engine."), engine
        assert importlib.util.find_spec(f"distributed_scoring.{engine}") is not None, f"{name}: no module {engine}"
