"""The chain-rule engine against the naive reference: every order of short sentences, several families."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.chain import ChainEngine
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.orders import orders_for

from helpers.reference import NaiveChain, scored_positions

FAMILIES = ("bert", "roberta", "albert", "deberta-v2")
SHORT = ("the fox", "the dog", "dog", "fox")  # one of them has 3 or 4 scored tokens in each family
LONGER = "she sells seashells by the seashore"


def short_sentence(mlm) -> list[int]:
    for text in SHORT:
        ids = mlm.tokenizer(text)["input_ids"]
        if 3 <= len(scored_positions(mlm.tokenizer, ids)) <= 4:
            return ids
    raise AssertionError("no short sentence of 3 or 4 scored tokens")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_order_equals_the_naive_chain(family, tiny_model_dir):
    """All T! orders of a sentence with T <= 4 scored tokens, in one call under a budget that splits
    the pairs over several batches: every step equals its naive conditional, every sum its chain."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
    naive = NaiveChain(mlm.model, mlm.mask_token_id)
    ids = short_sentence(mlm)
    scored = scored_positions(mlm.tokenizer, ids)
    orders = [np.array(p) for p in itertools.permutations(scored)]
    want = [naive.terms(ids, order.tolist()) for order in orders]
    assert np.std([sum(w) for w in want]) > 0.05, "orders too alike for the comparison to mean anything"
    engine = ChainEngine(mlm, batch_tokens=3 * len(ids))
    sequences = [np.array(ids)] * len(orders)
    got = engine.conditionals(sequences, orders)
    for order, g, w in zip(orders, got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5, err_msg=f"{family} {order}")
    np.testing.assert_allclose(engine.log_likelihoods(sequences, orders), [sum(w) for w in want], rtol=0, atol=1e-5)


def test_mixed_lengths_and_budgets_give_the_same_numbers(tiny_model_dir):
    """Sequences of different lengths, some orders covering only part of a sequence (the rest is
    context), under budgets from one row per batch to everything at once."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))
    naive = NaiveChain(mlm.model, mlm.mask_token_id)
    short, longer = short_sentence(mlm), mlm.tokenizer(LONGER)["input_ids"]
    rng = np.random.default_rng(0)
    pairs = [
        (short, scored_positions(mlm.tokenizer, short)[::-1]),
        (longer, rng.permutation(scored_positions(mlm.tokenizer, longer)).tolist()),
        (longer, [3, 1]),
        (short, []),
    ]
    want = [naive.log_likelihood(ids, order) for ids, order in pairs]
    for budget in (1, 40, 10**6):
        got = ChainEngine(mlm, budget).log_likelihoods([np.array(i) for i, _ in pairs], [np.array(o) for _, o in pairs])
        assert got.dtype == np.float64 and got[-1] == 0.0
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9, err_msg=f"budget {budget}")


def test_bad_orders_are_refused(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    engine = ChainEngine(mlm)
    ids = np.array(short_sentence(mlm))
    for order in ([1, 1], [1, len(ids)], [-1]):
        with pytest.raises(ValueError, match="distinct positions"):
            engine.log_likelihoods([ids], [np.array(order)])
    with pytest.raises(ValueError, match="one order per sequence"):
        engine.log_likelihoods([ids, ids], [np.array([1])])


def test_orders_for():
    positions = np.array([5, 1, 3, 2])
    rng = np.random.default_rng(0)
    assert [o.tolist() for o in orders_for(positions, "l2r", 1, rng)] == [[1, 2, 3, 5]]
    assert [o.tolist() for o in orders_for(positions, "r2l", 1, rng)] == [[5, 3, 2, 1]]
    drawn = orders_for(positions, "random", 20, np.random.default_rng(7))
    again = orders_for(positions, "random", 20, np.random.default_rng(7))
    assert len(drawn) == 20 and all(sorted(o.tolist()) == [1, 2, 3, 5] for o in drawn)
    assert [o.tolist() for o in drawn] == [o.tolist() for o in again]
    assert len({tuple(o.tolist()) for o in drawn}) > 5
    for order, k in (("l2r", 2), ("random", 0), ("sideways", 1)):
        with pytest.raises(ValueError):
            orders_for(positions, order, k, rng)
