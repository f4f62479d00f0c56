"""Shared by the PLL engine tests on CPU (tests/engine/test_pll.py) and on CUDA (tests/gpu/test_cuda.py):
the sentences they score and their preparation into engine inputs.

Here, at the top of tests/ (on `pythonpath`), rather than in test_pll.py: a test file in another folder
could import test_pll only after pytest had collected tests/engine, so `pytest tests/gpu` alone would fail.
"""

from __future__ import annotations

import numpy as np

import tiny
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.workloads.prepare import Preparer

TEXTS = tiny.CORPUS[:7] + ["Hi", "the", "internationalization, unbelievably", "Naïve café ☃ déjà-vu"]


def sentences_of(mlm, texts: list[str]) -> list[Sentence]:
    prepared = Preparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts)
    assert all(p.error is None for p in prepared), [p.error for p in prepared]
    return [Sentence(np.array(p.input_ids), np.array(p.targets), np.array(p.piece_words)) for p in prepared]
