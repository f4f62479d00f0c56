"""The conditionals engine against a naive one-pass-per-value float64 reference (tests/helpers/reference.py).

Every table is compared: q(a | b = v) and q(b | a = v) for every v in V, the both-masked marginals and
the raw logits, on tiny random BERT and RoBERTa models (real trained tokenizers), with a budget small
enough to split one example over many batches and one that holds everything in one batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.conditionals import ConditionalsEngine, Pair
from distributed_scoring.engine.joints import score_pair
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.errors import UserError
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers import tiny
from helpers.reference import NaivePairs, candidate_set

# (text, a, b): adjacent, reversed and distant pairs; the last text is short, so lengths differ in a batch.
EXAMPLES = [
    (tiny.CORPUS[0], 0, 1),
    (tiny.CORPUS[1], 6, 2),
    ("Naïve café owners", 3, 0),
]
# 120 tokens hold a few rows: an example's 2|V| rows run over dozens of batches, and batches mix examples.
BUDGETS = (120, 10**6)


def pairs_of(mlm, examples) -> list[Pair]:
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts([text for text, _, _ in examples])
    assert all(p.error is None for p in prepared), [p.error for p in prepared]
    return [Pair(np.array(p.input_ids), np.array(p.targets), a, b) for p, (_, a, b) in zip(prepared, examples)]


@pytest.fixture(scope="module")
def naive_tables(tiny_model_dir):
    """family -> the float64 reference tables of EXAMPLES (computed once per family)."""
    cache = {}

    def get(family: str):
        if family not in cache:
            mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
            naive = NaivePairs(mlm.model, mlm.tokenizer)
            cache[family] = [naive.tables(text, a, b) for text, a, b in EXAMPLES]
        return cache[family]

    return get


def assert_equal_to_reference(cond, ref, atol: float, label: str) -> None:
    vocab = ref.logits_a.shape[0]
    assert cond.log_a_given_b.shape == (vocab, vocab), label
    assert cond.gold == ref.gold, label
    assert_tables(cond, ref.logits_a, ref.logits_b, ref.marginal_a, ref.marginal_b, atol, label)


def assert_tables(cond, logits_a, logits_b, marginal_a, marginal_b, atol: float, label: str) -> None:
    """The engine's tables against raw reference logits: (Ka, Kb) at a and at b, and the marginals."""
    expected = {
        "log_a_given_b": logits_a.log_softmax(0),
        "log_b_given_a": logits_b.log_softmax(1),
        "log_a": marginal_a.log_softmax(0),
        "log_b": marginal_b.log_softmax(0),
        "logits_a": logits_a,
        "logits_b": logits_b,
    }
    got = {
        "log_a_given_b": cond.log_a_given_b,
        "log_b_given_a": cond.log_b_given_a,
        "log_a": cond.log_a,
        "log_b": cond.log_b,
        "logits_a": cond.logits_a(),
        "logits_b": cond.logits_b(),
    }
    for key, value in expected.items():
        np.testing.assert_allclose(got[key].double().cpu(), value, rtol=0, atol=atol, err_msg=f"{label} {key}")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_engine_equals_naive_reference(family, tiny_model_dir, naive_tables):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
    assert mlm.head is not None
    pairs = pairs_of(mlm, EXAMPLES)
    references = naive_tables(family)
    spread = torch.stack([r.logits_a.log_softmax(0) for r in references]).std()
    assert spread > 0.3, "conditionals too flat for the comparison to mean anything"
    assert 2 * mlm.model.config.vocab_size * min(len(p.input_ids) for p in pairs) > 20 * BUDGETS[0]
    for budget in BUDGETS:
        got = list(ConditionalsEngine(mlm, budget).conditionals(pairs))
        assert sorted(index for index, _ in got) == list(range(len(pairs)))
        for index, cond in got:
            assert cond.log_a_given_b.dtype == torch.float32
            assert_equal_to_reference(cond, references[index], 1e-5, f"{family} budget {budget} example {index}")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_engine_in_float64_equals_reference_to_rounding(family, tiny_model_dir, naive_tables):
    """In float64 only rounding is left: packing, scattering values and gathering rows are exact."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family)), dtype="float64"))
    references = naive_tables(family)
    for index, cond in ConditionalsEngine(mlm, BUDGETS[0]).conditionals(pairs_of(mlm, EXAMPLES)):
        assert cond.log_a_given_b.dtype == torch.float64
        assert_equal_to_reference(cond, references[index], 1e-9, f"{family} float64 example {index}")


def test_full_logits_fallback_is_exact(tiny_model_dir, naive_tables):
    """Architectures outside the head table go through the full model; that path must agree too."""
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("roberta"))))
    mlm.head = None
    references = naive_tables("roberta")
    for index, cond in ConditionalsEngine(mlm, 500).conditionals(pairs_of(mlm, EXAMPLES)):
        assert_equal_to_reference(cond, references[index], 1e-5, f"fallback example {index}")


def test_head_chunks_do_not_change_values(tiny_model_dir, monkeypatch):
    """Head outputs are produced a few rows at a time when rows x |V| exceeds HEAD_ELEMENTS (float64, so
    that a different matmul blocking cannot hide a misplaced row)."""
    import distributed_scoring.engine.masked_lm as models

    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))
    pairs = pairs_of(mlm, EXAMPLES)
    whole = dict(ConditionalsEngine(mlm, 4000).conditionals(pairs))
    monkeypatch.setattr(models, "HEAD_ELEMENTS", 3 * mlm.model.config.vocab_size)
    chunked = dict(ConditionalsEngine(mlm, 4000).conditionals(pairs))
    for index in whole:
        torch.testing.assert_close(chunked[index].log_a_given_b, whole[index].log_a_given_b, rtol=0, atol=1e-12)
        torch.testing.assert_close(chunked[index].log_b_given_a, whole[index].log_b_given_a, rtol=0, atol=1e-12)


def test_candidate_sets_agree_with_the_full_computation(tiny_model_dir, naive_tables):
    """top_k: the gold token plus the top k of q(. | other = gold) and of q(. | rest), per position; the
    tables are the full ones restricted to the candidates and renormalised over them."""
    k = 3
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    references = naive_tables("bert")
    larger = []  # the union is wider than k somewhere (else the test would not tell the sets apart)
    for index, cond in ConditionalsEngine(mlm, 200, top_k=k).conditionals(pairs_of(mlm, EXAMPLES)):
        ref = references[index]
        ga, gb = ref.gold
        sa = candidate_set(ref.logits_a[:, gb], ref.marginal_a, ga, k)
        sb = candidate_set(ref.logits_b[ga, :], ref.marginal_b, gb, k)
        np.testing.assert_array_equal(cond.support_a.cpu(), sa)
        np.testing.assert_array_equal(cond.support_b.cpu(), sb)
        larger.append(len(sa) > k and len(sb) > k)
        assert (int(cond.support_a[cond.gold[0]]), int(cond.support_b[cond.gold[1]])) == (ga, gb)
        logits_a = ref.logits_a[sa][:, sb]  # (Ka, Kb) the full raw logits on the candidates
        logits_b = ref.logits_b[sa][:, sb]
        assert_tables(cond, logits_a, logits_b, ref.marginal_a[sa], ref.marginal_b[sb], 1e-5, str(index))
        scores = score_pair(cond)
        assert all(np.isfinite(m.log_pair) and np.isfinite(m.a_kl) for m in scores.metrics.values())
    # Per example the union can collapse to k: the tiny tokenizer's training breaks ties differently in
    # every process (tokenizers' hash maps), so the tiny model, and its top-k sets, change from run to run.
    assert any(larger), larger


def test_real_antiberty_engine_in_float64_equals_reference(offline_model_dir):
    from distributed_scoring.offline.antibodies import spaced, v_genes

    path = str(offline_model_dir("antiberty"))
    mlm = load_masked_lm(ModelSpec(path, dtype="float64"))
    text = spaced(sorted(v_genes("human").values())[1][:12])
    (pair,) = pairs_of(mlm, [(text, 9, 2)])
    ((_, cond),) = ConditionalsEngine(mlm, 100).conditionals([pair])
    assert_equal_to_reference(cond, NaivePairs(mlm.model, mlm.tokenizer).tables(text, 9, 2), 1e-9, "antiberty")


@pytest.mark.parametrize("a, b", [(0, 0), (-1, 2), (0, 99)])
def test_pairs_must_name_two_distinct_tokens(a, b):
    with pytest.raises(UserError, match="non-special tokens"):
        Pair(np.array([2, 10, 11, 12, 3]), np.array([1, 2, 3]), a, b)


def test_top_k_must_be_positive(tiny_model_dir):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    with pytest.raises(UserError, match="top_k"):
        ConditionalsEngine(mlm, top_k=0)


def test_exact_joints_refuse_a_device_without_room_for_the_tables(tiny_model_dir, monkeypatch):
    """A vocabulary whose |V| x |V| tables do not fit is a clear error up front, not an OOM kill."""
    import distributed_scoring.engine.conditionals as conditionals

    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    vocab = mlm.model.config.vocab_size
    monkeypatch.setattr(conditionals, "free_memory", lambda device: conditionals.PEAK_TABLES * vocab**2 * 4 - 1)
    with pytest.raises(UserError, match="--top-k"):
        ConditionalsEngine(mlm)
    ConditionalsEngine(mlm, top_k=5)  # the approximation's small tables need no such room
    monkeypatch.setattr(conditionals, "free_memory", lambda device: conditionals.PEAK_TABLES * vocab**2 * 4)
    ConditionalsEngine(mlm)
