"""The engine against the naive reference, on every supported architecture, both variants, many budgets."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_scoring.config import VARIANTS, ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.pll import PLLEngine

from helpers import tiny
from helpers.pll import TEXTS, sentences_of
from helpers.reference import NaiveScorer

# The smallest budget is below one sentence's copies, so sentences are split across batches.
BUDGETS = (40, 300, 10**6)


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_engine_equals_naive_reference(family, tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
    assert mlm.head is not None, f"{family} should use the gathered-head fast path"
    naive = NaiveScorer(mlm.model, mlm.tokenizer)
    sentences = sentences_of(mlm, TEXTS)
    longest = max(len(s.input_ids) * len(s.targets) for s in sentences)
    assert longest > BUDGETS[0] * 10
    for variant in VARIANTS:
        expected = [naive.token_logprobs(text, variant) for text in TEXTS]
        spread = np.concatenate(expected).std()
        assert spread > 0.3, "conditionals too flat for the comparison to mean anything"
        for budget in BUDGETS:
            got = PLLEngine(mlm, variant, budget).token_logprobs(sentences)
            for text, g, e in zip(TEXTS, got, expected):
                assert g.shape == e.shape, text
                np.testing.assert_allclose(g, e, rtol=0, atol=1e-5, err_msg=f"{family} {variant} {budget} {text!r}")


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_engine_in_float64_equals_reference_to_rounding(family, tiny_model_dir):
    """In float64 the only difference left is rounding: packing, gathering and masking are exact."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family)), dtype="float64"))
    naive = NaiveScorer(mlm.model, mlm.tokenizer)
    sentences = sentences_of(mlm, TEXTS)
    for variant in VARIANTS:
        got = PLLEngine(mlm, variant, BUDGETS[0]).token_logprobs(sentences)
        for text, g in zip(TEXTS, got):
            np.testing.assert_allclose(g, naive.token_logprobs(text, variant), rtol=0, atol=1e-9)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_saved_conditionals_equal_the_naive_reference(family, tiny_model_dir):
    """The teacher's top-k of each conditional (a distillation target): the k most probable tokens of the
    naive reference's conditional, their log-probabilities, the mass of the rest; the PLL's terms as
    without conditionals; k = V keeps the whole conditional."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
    naive = NaiveScorer(mlm.model, mlm.tokenizer)
    sentences = sentences_of(mlm, TEXTS[:4])
    vocab = mlm.model.config.vocab_size
    for variant in VARIANTS:
        expected = [naive.conditionals(text, variant) for text in TEXTS[:4]]
        plain = PLLEngine(mlm, variant, BUDGETS[0]).token_logprobs(sentences)
        for k in (3, vocab, vocab + 5):
            got = PLLEngine(mlm, variant, BUDGETS[0]).token_conditionals(sentences, k)
            for text, g, e, p in zip(TEXTS, got, expected, plain):
                message = f"{family} {variant} k={k} {text!r}"
                kept = min(k, vocab)
                assert g.ids.shape == g.top.shape == (len(e), kept), message
                np.testing.assert_array_equal(g.logprobs, p, err_msg=message)
                order = np.argsort(-e, axis=1, kind="stable")[:, :kept]
                np.testing.assert_allclose(g.top, np.take_along_axis(e, order, 1), rtol=0, atol=1e-5, err_msg=message)
                np.testing.assert_allclose(np.take_along_axis(e, g.ids, 1), g.top, rtol=0, atol=1e-5, err_msg=message)
                if kept == vocab:
                    assert np.isneginf(g.rest).all(), message
                    assert sorted(g.ids[0]) == list(range(vocab)), message
                else:
                    others = np.ones_like(e, dtype=bool)
                    np.put_along_axis(others, g.ids, False, 1)
                    rest = np.log(np.where(others, np.exp(e), 0.0).sum(1))
                    np.testing.assert_allclose(g.rest, rest, rtol=0, atol=1e-5, err_msg=message)


def test_full_logits_fallback_is_exact(tiny_model_dir):
    """Architectures outside the head table go through the full model; that path must agree too."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("roberta"))))
    sentences = sentences_of(mlm, TEXTS)
    fast = PLLEngine(mlm, "original", 500).token_logprobs(sentences)
    mlm.head = None
    slow = PLLEngine(mlm, "original", 500).token_logprobs(sentences)
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f, s, rtol=0, atol=1e-5)


def test_word_l2r_masks_later_pieces_of_the_same_word(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    text = "internationalization unbelievably the"
    (sentence,) = sentences_of(mlm, [text])
    original = PLLEngine(mlm, "original").token_logprobs([sentence])[0]
    l2r = PLLEngine(mlm, "word_l2r").token_logprobs([sentence])[0]
    words = sentence.piece_words
    has_later_piece = np.array([(words[t + 1 :] == words[t]).any() for t in sentence.targets])
    assert has_later_piece.any() and (~has_later_piece).any()
    # A target with no later piece in its word sees the same input in both variants.
    np.testing.assert_array_equal(original[~has_later_piece], l2r[~has_later_piece])
    assert np.abs(original[has_later_piece] - l2r[has_later_piece]).min() > 1e-4


def test_out_of_memory_halves_the_budget_and_retries_the_batch(tiny_model_dir, monkeypatch):
    """A CUDA OOM (simulated: no GPU here) in a batch splits it and lowers the budget; results unchanged."""
    import torch

    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    sentences = sentences_of(mlm, TEXTS)
    expected = PLLEngine(mlm, "original", 2000).token_logprobs(sentences)
    engine = PLLEngine(mlm, "original", 2000)
    forward = engine.forward
    sizes = []

    def forward_with_memory_limit(batch):
        sizes.append(len(batch))
        if len(batch) > 7:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(batch)

    monkeypatch.setattr(engine, "forward", forward_with_memory_limit)
    got = engine.token_logprobs(sentences)
    assert max(sizes) > 7 and engine.batch_tokens < 2000
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)


def test_head_chunks_do_not_change_results(tiny_model_dir, monkeypatch):
    """Logits come a few rows at a time when rows x V exceeds HEAD_ELEMENTS (float64: a misplaced row
    would show, blocking differences would not)."""
    import distributed_scoring.engine.masked_lm as models

    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))
    sentences = sentences_of(mlm, TEXTS)
    whole = PLLEngine(mlm, "word_l2r", 2000).token_logprobs(sentences)
    monkeypatch.setattr(models, "HEAD_ELEMENTS", 3 * mlm.model.config.vocab_size)
    chunked = PLLEngine(mlm, "word_l2r", 2000).token_logprobs(sentences)
    for w, c in zip(whole, chunked):
        np.testing.assert_allclose(c, w, rtol=0, atol=1e-12)


def test_progress_is_reported_after_every_forward_pass(tiny_model_dir):
    """The pipeline's progress display moves by these reports within a shard: they rise to exactly the
    tokens of all masked copies, and a budget below one sentence's copies gives many of them."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    sentences = sentences_of(mlm, TEXTS)
    reports: list[tuple[int, int]] = []
    PLLEngine(mlm, "original", BUDGETS[0]).token_logprobs(sentences, lambda done, total: reports.append((done, total)))
    total = sum(len(s.input_ids) * len(s.targets) for s in sentences)
    assert {t for _, t in reports} == {total} and reports[-1] == (total, total)
    assert len(reports) > len(sentences) and all(a < b for (a, _), (b, _) in zip(reports, reports[1:]))
