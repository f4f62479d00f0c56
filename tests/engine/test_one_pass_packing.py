"""One-pass batches of sentences of similar length: the packer's padding limit on random shapes and on
LibriSpeech-like lengths (executed/useful from `packing.Work`), the maskless engine's scores against the naive
one-sentence float64 reference whatever the budget and order, its forward passes counted by a hook on the
encoder, and each call's values copied to the host once."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine import masked_lm
from distributed_scoring.engine.causal import CausalEngine, encode, load_causal_lm
from distributed_scoring.engine.causal import pack as causal_pack
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.maskless import MasklessEngine, unmasked_scorer
from distributed_scoring.engine.packing import ONE_PASS_PADDING, TokenBudget, Work, pack, rows_of
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import rescoring as H
from helpers import tiny
from helpers.reference import unmasked_logprobs

CPU_BUDGET, CUDA_BUDGET = masked_lm.DEFAULT_BATCH_TOKENS["cpu"], masked_lm.DEFAULT_BATCH_TOKENS["cuda"]


def librispeech_like(n: int, seed: int = 0) -> list[int]:
    """Token counts of n utterances, specials included: lognormal, median 20, a tail to about 120."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(20), 0.6, n)), 5, 128).astype(int).tolist()


def work_of(lengths: list[int], budget: int, padding: float | None) -> Work:
    batches = pack(lengths, [1] * len(lengths), TokenBudget(budget), padding)
    return functools.reduce(Work.__add__, (Work.of(b, lengths) for b in batches), Work())


@pytest.mark.parametrize("padding", [1.0, 1.1, 1.5])
@pytest.mark.parametrize("budget", [1, 50, 1000, 10**6])
def test_a_padding_limit_bounds_every_batch_and_still_covers_every_row_once(budget, padding):
    rng = np.random.default_rng(budget)
    lengths, counts = rng.integers(1, 60, size=80).tolist(), rng.integers(0, 4, size=80).tolist()
    batches = list(pack(lengths, counts, TokenBudget(budget), padding))
    seen = [(p.group, row) for batch in batches for p in batch for row in range(p.start, p.end)]
    assert sorted(seen) == [(g, r) for g in range(len(lengths)) for r in range(counts[g])]
    order = [lengths[p.group] for batch in batches for p in batch]
    assert order == sorted(order, reverse=True)
    works = [Work.of(batch, lengths) for batch in batches]
    for batch, work in zip(batches, works):
        assert work.padding <= padding + 1e-12
        assert rows_of(batch) == 1 or work.executed <= budget
    total = functools.reduce(Work.__add__, works, Work())
    assert (total.batches, total.rows, total.useful) == (len(batches), sum(counts), int(np.dot(lengths, counts)))


def test_a_padding_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        list(pack([3], [1], TokenBudget(10), 0.9))


@pytest.mark.parametrize("n", [100, 1000])
@pytest.mark.parametrize("budget", [CPU_BUDGET, CUDA_BUDGET])
def test_librispeech_like_lengths_run_at_most_1_15_tokens_per_real_token(n, budget):
    """Filled to the CUDA budget, a shard's batches were mostly padding (3.24 tokens run per real one for
    1,000 sentences); under the one-pass limit they run at most 1.15, in a few more batches."""
    lengths = librispeech_like(n)
    assert np.median(lengths) == pytest.approx(20, abs=2) and max(lengths) > (100 if n == 1000 else 60)
    bucketed, filled = work_of(lengths, budget, ONE_PASS_PADDING), work_of(lengths, budget, None)
    assert bucketed.padding <= ONE_PASS_PADDING <= 1.15
    assert bucketed.rows == filled.rows == n and bucketed.useful == filled.useful == sum(lengths)
    if budget == CUDA_BUDGET:
        assert filled.padding > 2.5
        assert bucketed.batches <= 20  # about one per 10% step of length: ln(128 / 5) / ln(1.1) = 34 at most
    else:
        assert bucketed.padding <= filled.padding


def spread_sentences(mlm) -> tuple[list[str], list[Sentence]]:
    """Runs of 1 to 34 words of the corpus, shuffled: lengths from a few tokens to near the model's maximum
    (a run too long for the model is left out)."""
    words = " ".join(tiny.CORPUS).split()
    sizes = (6, 1, 34, 3, 12, 2, 25, 9, 4, 30, 16, 1, 20, 5, 8)
    texts = [" ".join(words[7 * i : 7 * i + k]) for i, k in enumerate(sizes)]
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts)
    kept = [(t, p) for t, p in zip(texts, prepared) if p.input_ids is not None]
    sentences = [Sentence(np.asarray(p.input_ids), np.asarray(p.targets), np.asarray(p.piece_words)) for _, p in kept]
    return [t for t, _ in kept], sentences


class EncoderCalls:
    """(rows, width) of every call of the encoder: the forward passes as the model sees them."""

    def __init__(self, mlm) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.encoder = mlm.encoder

    def __enter__(self) -> "EncoderCalls":
        def record(module, args, kwargs) -> None:
            self.shapes.append(tuple(kwargs["input_ids"].shape))

        self.handle = self.encoder.register_forward_pre_hook(record, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


@pytest.mark.parametrize("family", ["bert", "roberta", "deberta-v2"])
def test_bucketed_one_pass_scores_equal_the_naive_reference_in_input_order(family, tiny_model_dir):
    """fp32 scores of sentences of widely spread lengths, in a shuffled order, equal the float64 reference of
    one sentence per forward within 1e-5 under any budget; the engine's `work` is what the encoder ran."""
    scorer = unmasked_scorer(ModelSpec(str(tiny_model_dir(family))))
    texts, sentences = spread_sentences(scorer.mlm)
    lengths = [len(s.input_ids) for s in sentences]
    assert max(lengths) > 3 * min(lengths), "lengths too alike for bucketing to show"
    expected = [unmasked_logprobs(scorer.mlm.model, scorer.mlm.tokenizer, text) for text in texts]
    for budget in (20, 150, CPU_BUDGET, CUDA_BUDGET):
        engine = MasklessEngine(scorer, budget)
        with EncoderCalls(scorer.mlm) as calls:
            got = engine.predict(sentences)
        for text, g, e in zip(texts, got, expected):
            np.testing.assert_allclose(g.token_logprobs, e, rtol=0, atol=1e-5, err_msg=f"{family} {budget} {text!r}")
            assert g.pll == pytest.approx(e.sum(), abs=1e-4)
        work = engine.work
        assert work.batches == len(calls.shapes) and work.rows == len(sentences)  # one pass per sentence
        assert work.executed == sum(rows * width for rows, width in calls.shapes)
        assert work.useful == sum(lengths) and work.padding <= ONE_PASS_PADDING
        if budget == CUDA_BUDGET:
            assert 1 < work.batches < len(sentences), "sentences of similar length share a pass"


class HostCopies:
    """Counts device-to-host copies (`Tensor.cpu`) while it is entered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = torch.Tensor.cpu

        def counted(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            self.count += 1
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "cpu", counted)


def test_a_call_copies_its_values_to_the_host_once_whatever_its_batches(tiny_model_dir, tmp_path, monkeypatch):
    """Maskless, PLL and causal-LM engines: many batches, one device-to-host copy."""
    spec = ModelSpec(str(tiny_model_dir("bert")))
    scorer = unmasked_scorer(spec)
    texts, sentences = spread_sentences(scorer.mlm)
    lm = load_causal_lm(ModelSpec(str(H.save_tiny_causal("gpt2", tmp_path / "gpt2"))))
    sequences = [ids for ids in encode(lm, texts) if len(ids) <= lm.max_length]
    maskless, pll, causal = MasklessEngine(scorer, 150), PLLEngine(scorer.mlm, batch_tokens=150), CausalEngine(lm, 150)
    copies = HostCopies(monkeypatch)
    for call, batches in (
        (lambda: maskless.predict(sentences), lambda: maskless.work.batches),
        (lambda: pll.token_logprobs(sentences[:4]), lambda: pll.batches),
        (lambda: causal.token_logprobs(sequences), lambda: len(causal_pack([len(q) for q in sequences], 150))),
    ):
        copies.count = 0
        call()
        assert batches() > 2 and copies.count == 1


def test_values_beyond_a_head_calls_worth_come_over_in_parts_in_order(monkeypatch):
    """What a call keeps on the device is bounded: past `HEAD_ELEMENTS` values it is copied, in order."""
    monkeypatch.setattr(masked_lm, "HEAD_ELEMENTS", 5)
    copies = HostCopies(monkeypatch)
    kept = masked_lm.OnDevice()
    parts = [torch.arange(k * 3, dtype=torch.float32).reshape(k, 3) + 100 * k for k in (1, 2, 3, 1)]
    for part in parts:
        kept.add(part)
    assert copies.count == 2  # after 9 values, then after 9 more; the last 3 are still on the device
    np.testing.assert_array_equal(kept.host(), torch.cat(parts).double().numpy())
    assert copies.count == 3
    assert masked_lm.OnDevice().host().shape == (0,)
