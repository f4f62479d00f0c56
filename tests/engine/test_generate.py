"""Generation in any order (u-PMLM Algorithm 1) through the infilling engine: its `given` order and its
`filtered` sampler, against the naive step-by-step reference and the chain engine."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.chain import ChainEngine
from distributed_scoring.engine.infill import InfillEngine, InfillExample, InfillSettings
from distributed_scoring.engine.masked_lm import load_masked_lm

from helpers.reference import NaiveChain

GREEDY = InfillSettings("standard", "given", beam=1)


@pytest.fixture(scope="module")
def mlm(tiny_model_dir):
    return load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))


@pytest.fixture(scope="module")
def allowed(mlm) -> np.ndarray:
    out = np.zeros(mlm.model.config.vocab_size, dtype=bool)
    out[: len(mlm.tokenizer)] = True
    out[mlm.tokenizer.all_special_ids] = False
    return out


def prompts(mlm) -> list[InfillExample]:
    """All-mask sequences and constrained ones (a fixed prefix, suffix or middle), each with an order."""
    t = mlm.tokenizer
    rng = np.random.default_rng(3)
    out = []
    for n, text in enumerate(
        [
            "[MASK]" * 6,
            "the quick [MASK] [MASK] [MASK]",
            "[MASK] [MASK] over the lazy dog",
            "she [MASK] seashells [MASK] the [MASK]",
            "[MASK]" * 3,
        ]
    ):
        ids = np.array(t(text)["input_ids"], dtype=np.int64)
        masks = np.flatnonzero(ids == t.mask_token_id)
        out.append(InfillExample(ids, masks, seed=n, order=rng.permutation(masks)))
    return out


def test_greedy_generation_equals_the_naive_argmax_step_by_step(mlm, allowed):
    """Every example in one search (one packed forward per step), under a budget that splits the steps."""
    naive = NaiveChain(mlm.model, mlm.mask_token_id)
    examples = prompts(mlm)
    fills = InfillEngine(mlm, allowed, batch_tokens=12).search(examples, GREEDY)
    for example, (fill,) in zip(examples, fills):
        ids, score = naive.greedy(example.input_ids, example.order.tolist(), np.flatnonzero(allowed).tolist())
        assert fill.tokens.tolist() == [ids[m] for m in example.masks]
        assert fill.order == tuple(example.order.tolist())
        assert fill.chain == pytest.approx(score, abs=1e-9)


def test_temperature_towards_zero_and_top_k_one_are_greedy(mlm, allowed):
    examples = prompts(mlm)
    engine = InfillEngine(mlm, allowed)
    greedy = [f[0].tokens.tolist() for f in engine.search(examples, GREEDY)]
    for settings in (
        InfillSettings("filtered", "given", 1, temperature=1e-6, top_k=0, top_p=1.0),
        InfillSettings("filtered", "given", 1, temperature=1.0, top_k=1, top_p=1.0),
        InfillSettings("filtered", "given", 1, temperature=2.0, top_k=0, top_p=1e-9),
    ):
        assert [f[0].tokens.tolist() for f in engine.search(examples, settings)] == greedy


def test_sampled_sequences_are_seeded_and_scored_by_their_chain(mlm, allowed):
    """A sample's chain score is the chain engine's log-likelihood of the filled sequence along the fill
    order (the constraints are context); the same seeds give the same samples, other seeds others."""
    examples = prompts(mlm)
    engine = InfillEngine(mlm, allowed)
    settings = InfillSettings("filtered", "given", 1, temperature=1.5, top_k=50, top_p=0.95)
    fills = [f[0] for f in engine.search(examples, settings)]
    again = [f[0] for f in engine.search(examples, settings)]
    assert [f.tokens.tolist() for f in fills] == [f.tokens.tolist() for f in again]
    reseeded = [InfillExample(e.input_ids, e.masks, e.seed + 100, e.order) for e in examples]
    assert [f[0].tokens.tolist() for f in engine.search(reseeded, settings)] != [f.tokens.tolist() for f in fills]
    filled = []
    for e, f in zip(examples, fills):
        ids = e.input_ids.copy()
        ids[e.masks] = f.tokens
        filled.append(ids)
    chains = ChainEngine(mlm).log_likelihoods(filled, [np.array(f.order) for f in fills])
    np.testing.assert_allclose([f.chain for f in fills], chains, rtol=0, atol=1e-9)


def test_the_filtered_sampler_draws_from_the_tempered_top_k(mlm, allowed):
    """3,000 one-token samples of one context: frequencies follow softmax(log p / T) over the top k
    tokens (chi-square at 0.1%, fixed seeds, so the test is deterministic); nothing outside them."""
    ids = np.array(mlm.tokenizer("the quick [MASK] fox")["input_ids"], dtype=np.int64)
    masks = np.flatnonzero(ids == mlm.mask_token_id)
    examples = [InfillExample(ids, masks, seed, masks) for seed in range(3000)]
    settings = InfillSettings("filtered", "given", 1, temperature=0.7, top_k=4, top_p=1.0)
    drawn = [f[0].tokens[0] for f in InfillEngine(mlm, allowed, 1 << 16).search(examples, settings)]
    logp = NaiveChain(mlm.model, mlm.mask_token_id).logp(ids.tolist(), int(masks[0]))
    candidates = np.flatnonzero(allowed)
    top = candidates[np.argsort(-logp[candidates], kind="stable")[:4]]
    assert set(drawn) <= set(top.tolist())
    weights = logp[top] / 0.7
    expected = 3000 * np.exp(weights - np.logaddexp.reduce(weights))
    counts = np.array([drawn.count(t) for t in top])
    assert float(((counts - expected) ** 2 / expected).sum()) < 16.27  # chi-square, 3 dof, p = 0.001


def test_the_given_order_must_permute_the_masks(mlm, allowed):
    example = prompts(mlm)[1]
    engine = InfillEngine(mlm, allowed)
    for order in (None, example.masks[:-1], example.masks + 1):
        with pytest.raises(ValueError, match="permuted"):
            engine.search([InfillExample(example.input_ids, example.masks, 0, order)], GREEDY)
