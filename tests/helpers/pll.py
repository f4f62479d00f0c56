"""Shared by the PLL engine tests on CPU (tests/engine/test_pll.py) and on CUDA (tests/gpu/test_cuda.py):
the sentences they score and their preparation into engine inputs; and by the API tests (tests/api):
the comparison of two scored rows.

Here, in the helper package, rather than in test_pll.py: no test file imports another (one in another folder
could import test_pll only after pytest had collected tests/engine, so `pytest tests/gpu` alone would fail).
"""

from __future__ import annotations

import numpy as np
import pytest

from distributed_scoring.engine.masking import Sentence
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import tiny

TEXTS = tiny.CORPUS[:7] + ["Hi", "the", "internationalization, unbelievably", "Naïve café ☃ déjà-vu"]


def sentences_of(mlm, texts: list[str]) -> list[Sentence]:
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts)
    assert all(p.error is None for p in prepared), [p.error for p in prepared]
    return [Sentence(np.array(p.input_ids), np.array(p.targets), np.array(p.piece_words)) for p in prepared]


def assert_same(row: dict, want: dict) -> None:
    """Equal rows; log-probabilities within 1e-5 and perplexities within 1e-5 relative (exp(-pll / n): a
    PLL 1e-5 off moves it by up to 1e-5 / n relative; two batchings of the same rows differ by about 1e-6 in
    fp32), lists of floats element by element, NaN equal to NaN."""
    assert row.keys() == want.keys()
    for key, value in row.items():
        if isinstance(value, float):
            assert want[key] == pytest.approx(value, rel=1e-5, abs=1e-5, nan_ok=True), key
        elif isinstance(value, list) and value and isinstance(value[0], float):
            np.testing.assert_allclose(value, want[key], rtol=0, atol=1e-5, err_msg=key)
        else:
            assert value == want[key], key
