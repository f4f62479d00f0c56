"""The runnable examples in the API's docstrings, run as doctests against a tiny model (no downloads),
with the Hugging Face Hub out of reach (its endpoint a loopback port that refuses connections, offline mode
off): the examples name `model` where a user writes a Hub id, and the method examples use one `scorer` (a
protein model's, `protein_model` and `protein_scorer`, for variant effects). The examples of README.md and
docs/python.md run in test_examples.py."""

from __future__ import annotations

import doctest
import math
import socket

import pytest

from distributed_scoring import MLMScorer
from distributed_scoring.api import pool, scorer, stages


@pytest.mark.parametrize("module", [scorer, stages, pool], ids=lambda m: m.__name__)
def test_docstring_examples_run(module, tiny_model_dir, tiny_protein_dir, monkeypatch):
    from huggingface_hub import constants

    model, protein = str(tiny_model_dir("bert")), str(tiny_protein_dir("bert"))
    with socket.socket() as unreachable:  # bound, never listening: every connection to it is refused
        unreachable.bind(("127.0.0.1", 0))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{unreachable.getsockname()[1]}")
        names = {
            "model": model,
            "scorer": MLMScorer(model, device="cpu"),
            "protein_model": protein,
            "protein_scorer": MLMScorer(protein, device="cpu"),
            "math": math,
        }
        result = doctest.testmod(module, extraglobs=names, optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted >= 3 and result.failed == 0
