"""GPU-only checks: the bf16-autocast engine against the float64 reference, fp32 on CUDA exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.pll import PLLEngine

from helpers.pll import TEXTS, sentences_of
from helpers.reference import NaiveScorer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert"])
def test_cuda_float32_exact_and_bf16_close(family, tiny_model_dir):
    path = str(tiny_model_dir(family))
    fp32 = load_masked_lm(ModelSpec(path, device="cuda", dtype="float32"))
    bf16 = load_masked_lm(ModelSpec(path, device="cuda"))
    assert bf16.autocast_dtype in (torch.bfloat16, torch.float16)
    cpu = load_masked_lm(ModelSpec(path, device="cpu"))
    naive = NaiveScorer(cpu.model, cpu.tokenizer)
    sentences = sentences_of(cpu, TEXTS)
    exact = PLLEngine(fp32, "original", 300).token_logprobs(sentences)
    approx = PLLEngine(bf16, "original", 300).token_logprobs(sentences)
    for text, e, a in zip(TEXTS, exact, approx):
        reference = naive.token_logprobs(text)
        np.testing.assert_allclose(e, reference, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a, reference, rtol=0, atol=0.1)
