"""The runnable examples in the API's docstrings, run as doctests against a tiny model (no downloads):
the examples name `model` where a user writes a Hub id, and the method examples use one `scorer`. The
README's and docs/python.md's first example run as written on a CPU machine, the tiny model in place of
their Hub id."""

from __future__ import annotations

import doctest
import math
import re
from pathlib import Path

import pytest

from distributed_scoring import MLMScorer
from distributed_scoring.api import hf, scorer, stages


@pytest.mark.parametrize("module", [scorer, stages, hf], ids=lambda m: m.__name__)
def test_docstring_examples_run(module, tiny_model_dir):
    model = str(tiny_model_dir("bert"))
    names = {"model": model, "scorer": MLMScorer(model, device="cpu"), "math": math}
    result = doctest.testmod(module, extraglobs=names, optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted >= 3 and result.failed == 0


@pytest.mark.parametrize("page", ["README.md", "docs/python.md"])
def test_the_first_python_example_runs_as_written_on_a_cpu_machine(page, tiny_model_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = (Path(__file__).resolve().parents[2] / page).read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "MLMScorer(" in block)
    assert '"bert-base-cased"' in example
    namespace: dict = {}
    exec(example.replace('"bert-base-cased"', repr(str(tiny_model_dir("bert")))), namespace)
    assert namespace["scorer"].signature["device"] == "cpu"
    plls = namespace["scorer"].pll(["The cat sat on the mat.", "The cat sat on the hat."])
    assert len(plls) == 2 and all(p < 0 for p in plls)
