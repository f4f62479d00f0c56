"""Weights in bfloat16 or float16 (`--dtype bfloat16|float16`) beside the default autocast: the weights really
are in that dtype, the head's logits and every log-softmax over the vocabulary are float32, the scores stay
within a bound of float32's, and the signature tells half-precision weights from autocast over float32 ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.causal import CausalEngine, encode, load_causal_lm
from distributed_scoring.engine.masked_lm import load_masked_lm, load_pretrained, resolve_autocast_dtype
from distributed_scoring.engine.masking import Sentence, build
from distributed_scoring.engine.maskless import MasklessEngine, unmasked_scorer
from distributed_scoring.engine.packing import Piece
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import rescoring as H
from helpers import tiny

# Largest |difference| per token from float32 allowed to half-precision weights (nats): the bound, and
# tighter ones that hold on the tiny models with room to spare (measured on CPU, every tiny family: bf16 at
# most 0.055 per token and 0.0095 on average; fp16 0.0034 and 0.0008).
BOUND = 0.13
TIGHTER = {"bfloat16": (0.08, 0.02), "float16": (0.01, 0.002)}  # (max, mean) per token


def sentences_of(mlm) -> list[Sentence]:
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(tiny.CORPUS)
    return [Sentence(np.asarray(p.input_ids), np.asarray(p.targets), np.asarray(p.piece_words)) for p in prepared]


def spec(folder, dtype: str) -> ModelSpec:
    return ModelSpec(str(folder), device="cpu", dtype=dtype)


def assert_close_to(got: list[np.ndarray], expected: list[np.ndarray], dtype: str, what: str) -> None:
    diff = np.abs(np.concatenate(got) - np.concatenate(expected))
    assert diff.max() <= BOUND, what
    most, mean = TIGHTER[dtype]
    assert diff.max() <= most and diff.mean() <= mean, (what, diff.max(), diff.mean())
    assert diff.max() > 0, f"{what}: no difference at all, so the weights were not in {dtype}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family", ["bert", "roberta", "deberta-v2"])
def test_half_precision_weights_score_within_the_bound_of_float32(family, dtype, tiny_model_dir):
    """PLL (masked copies) and `unmasked` (one pass) terms of every sentence, per token."""
    folder = tiny_model_dir(family)
    full, half = load_masked_lm(spec(folder, "float32")), load_masked_lm(spec(folder, dtype))
    assert {p.dtype for p in half.model.parameters()} == {getattr(torch, dtype)}
    assert half.autocast_dtype is None and half.weights_dtype == getattr(torch, dtype)
    assert half.head_dtype == torch.float32
    sentences = sentences_of(full)
    assert_close_to(
        PLLEngine(half).token_logprobs(sentences), PLLEngine(full).token_logprobs(sentences), dtype, f"{family} pll"
    )
    one_pass = [
        [p.token_logprobs for p in MasklessEngine(unmasked_scorer(spec(folder, d))).predict(sentences)]
        for d in (dtype, "float32")
    ]
    assert_close_to(*one_pass, dtype, f"{family} unmasked")


def test_causal_lm_bf16_weights_score_within_the_bound_of_float32(tmp_path):
    folder = H.save_tiny_causal("gpt2", tmp_path / "gpt2")
    full, half = load_causal_lm(spec(folder, "float32")), load_causal_lm(spec(folder, "bfloat16"))
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16} and half.autocast_dtype is None
    assert half.head_dtype == torch.float32
    sequences = encode(full, tiny.CORPUS)
    assert_close_to(
        CausalEngine(half).token_logprobs(sequences), CausalEngine(full).token_logprobs(sequences), "bfloat16", "gpt2"
    )


class LogSoftmaxDtypes:
    """Records the dtype of every `torch.logsumexp` input: the normaliser of each log-softmax the engines take."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[torch.dtype] = []
        original = torch.logsumexp

        def spy(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            self.seen.append(x.dtype)
            return original(x, *args, **kwargs)

        monkeypatch.setattr(torch, "logsumexp", spy)


def test_over_bf16_weights_the_head_is_bf16_and_every_log_softmax_float32(tiny_model_dir, tmp_path, monkeypatch):
    mlm = load_masked_lm(spec(tiny_model_dir("bert"), "bfloat16"))
    assert {p.dtype for p in mlm.model.cls.parameters()} == {torch.bfloat16}
    sentences = sentences_of(mlm)
    batch = build(sentences, [Piece(0, 0, len(sentences[0].targets))], "original", mlm.mask_token_id, mlm.pad_token_id)
    logits = list(mlm.logits_at(batch.input_ids, batch.attention_mask, batch.positions))
    assert {chunk.dtype for chunk in logits} == {torch.float32}
    spied = LogSoftmaxDtypes(monkeypatch)
    assert PLLEngine(mlm).forward(batch).dtype == torch.float32
    MasklessEngine(unmasked_scorer(spec(tiny_model_dir("bert"), "bfloat16"))).predict(sentences)
    lm = load_causal_lm(spec(H.save_tiny_causal("gpt2", tmp_path / "gpt2"), "bfloat16"))
    CausalEngine(lm).token_logprobs(encode(lm, tiny.CORPUS[:2]))
    assert len(spied.seen) >= 3 and set(spied.seen) == {torch.float32}


def test_the_signature_tells_bf16_weights_from_bf16_autocast(tiny_model_dir):
    """`dtype` is what the encoder computes in, `weights_dtype` what its weights are held in."""
    folder = tiny_model_dir("bert")
    signatures = {d: load_masked_lm(spec(folder, d)).signature for d in ("auto", "float32", "float64", "bfloat16")}
    assert {d: (s["dtype"], s["weights_dtype"]) for d, s in signatures.items()} == {
        "auto": ("float32", "float32"),  # on CPU
        "float32": ("float32", "float32"),
        "float64": ("float64", "float64"),
        "bfloat16": ("bfloat16", "bfloat16"),
    }
    from transformers import AutoModelForMaskedLM

    loaded = load_pretrained(AutoModelForMaskedLM, spec(folder, "auto"), "masked LM", "")
    on_cuda = dataclasses.replace(loaded, autocast_dtype=torch.bfloat16)  # what `auto` loads on a CUDA device
    assert (on_cuda.signature(spec(folder, "auto"), 94)["dtype"], on_cuda.weights_dtype) == ("bfloat16", torch.float32)
    assert on_cuda.signature(spec(folder, "auto"), 94)["weights_dtype"] == "float32"


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_a_named_dtype_is_never_autocast(dtype):
    """Only `auto` autocasts (on CUDA); a named dtype is the weights' own, on any device."""
    assert resolve_autocast_dtype(dtype, torch.device("cuda")) is None
    assert resolve_autocast_dtype(dtype, torch.device("cpu")) is None
    assert resolve_autocast_dtype("auto", torch.device("cpu")) is None
