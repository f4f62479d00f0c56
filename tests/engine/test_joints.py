"""The five pairwise joints and the sec. 3 metrics (Torroba-Hennigen & Kim, 2023) on small known cases.

Compatible conditionals (derived from a known joint): HCB and AG recover it and are faithful (A-KL 0),
the MRF is not (app. B, KL 1.27). Incompatible ones (Goyal et al., 2022, app. C; and random pairs): AG's
joint minimises eq. 4, checked against a brute-force minimiser. Every metric is recomputed from its
sec. 3 definition with the joint's conditionals materialised. Both references are in tests/helpers/reference.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.conditionals import ConditionalsEngine, Pair
from distributed_scoring.engine.joint_stats import CONSTRUCTIONS, JointOptions, JointStats, corpus_stats
from distributed_scoring.engine.joints import ag_joint, conditional_kls, construct, normalise, pair_metrics, score_pair
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.errors import UserError
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers.pairwise import conditionals_of, conditionals_of_joint
from helpers.reference import eq4_objective, joint_metrics, kl, minimise_eq4

F64 = torch.float64
# Enough Arnold-Gokhale iterations to converge on these small cases (50, the default, is not: see below).
CONVERGED = JointOptions(ag_iterations=2000)


def random_joint(size: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return normalise(torch.randn(size, size, dtype=F64, generator=generator) * scale)


def appendix_b_joint() -> torch.Tensor:
    return torch.tensor([[0.97, 0.01], [0.01, 0.01]], dtype=F64).log()


@pytest.mark.parametrize("size, seed", [(2, 0), (5, 1), (9, 2)])
@pytest.mark.parametrize("pivot", ["mode", "unary", "gold", "mask", 1])
def test_hcb_and_ag_recover_a_compatible_joint(size, seed, pivot):
    truth = random_joint(size, seed)
    cond = conditionals_of_joint(truth, gold=(size - 1, 0), mask_id=size // 2)
    options = JointOptions(pivot=pivot, ag_iterations=CONVERGED.ag_iterations)
    for name in ("HCB", "AG"):
        joint = construct(cond, name, options).log_prob
        assert kl(truth, joint) < 1e-6, name
        m = pair_metrics(cond, joint)
        assert abs(m.a_kl) < 1e-6 and abs(m.g_kl) < 1e-6, (name, m)
        assert m.log_pair == pytest.approx(float(truth[size - 1, 0]), abs=1e-6)
    # The MRF, fed the same compatible conditionals, is neither the joint nor faithful (app. B).
    mrf = construct(cond, "MRF").log_prob
    assert kl(truth, mrf) > 1e-3
    assert pair_metrics(cond, mrf).a_kl > 1e-3


def test_appendix_b_mrf_is_unfaithful_by_the_papers_jensen_gap():
    """App. B: p(a, a) = 0.97, else 0.01; the MRF's q(w_1 | w_2 = b) is KL ~ 1.27 away from p(w_1 | b)."""
    cond = conditionals_of_joint(appendix_b_joint())
    kl_a, kl_b = conditional_kls(cond, construct(cond, "MRF").log_prob)
    expected = math.log(1 / 196 + 1 / 4) - 0.5 * math.log(1 / 196)  # the paper's last line
    assert expected == pytest.approx(1.27, abs=5e-3)
    assert float(kl_a[1]) == pytest.approx(expected, abs=1e-12)
    assert float(kl_b[1]) == pytest.approx(expected, abs=1e-12)  # the joint is symmetric
    kl_a, kl_b = conditional_kls(cond, construct(cond, "HCB").log_prob)
    assert float(kl_a.abs().max()) < 1e-12 and float(kl_b.abs().max()) < 1e-12


def goyal_conditionals():
    """Goyal et al. (2022), sec. 2.1: p(X1 | X2) = [[.99, .01], [.01, .99]] (rows X2), p(X2 | X1) uniform."""
    x1_given_x2 = torch.tensor([[0.99, 0.01], [0.01, 0.99]], dtype=F64)  # [x2, x1]
    return x1_given_x2.T.log(), torch.full((2, 2), 0.5, dtype=F64).log()


def appendix_b_against_independence():
    """q(a | b) from app. B's joint, q(b | a) from the product of its marginals: incompatible."""
    joint = appendix_b_joint()
    independent = joint.logsumexp(1)[:, None] + joint.logsumexp(0)[None, :]
    return joint - joint.logsumexp(0, keepdim=True), independent - independent.logsumexp(1, keepdim=True)


def random_incompatible(size: int, seed: int):
    first, second = random_joint(size, seed), random_joint(size, seed + 100)
    return first - first.logsumexp(0, keepdim=True), second - second.logsumexp(1, keepdim=True)


INCOMPATIBLE = {
    "goyal2022": goyal_conditionals(),
    "appendix-b-vs-independent": appendix_b_against_independence(),
    "random-3": random_incompatible(3, 3),
    "random-4": random_incompatible(4, 4),
}


@pytest.mark.parametrize("case", INCOMPATIBLE)
def test_ag_minimises_eq4_on_incompatible_conditionals(case):
    log_a_given_b, log_b_given_a = INCOMPATIBLE[case]
    cond = conditionals_of(
        log_a_given_b, log_b_given_a, log_a_given_b.mean(1).log_softmax(0), log_b_given_a.mean(0).log_softmax(0)
    )
    ag = construct(cond, "AG", CONVERGED)
    assert ag.change < 1e-12
    objective = {
        name: float(eq4_objective(construct(cond, name, CONVERGED).log_prob, log_a_given_b, log_b_given_a))
        for name in CONSTRUCTIONS
    }
    assert objective["AG"] < objective["MRF"] - 1e-3 and objective["AG"] < objective["HCB"] - 1e-3, objective
    brute = minimise_eq4(log_a_given_b, log_b_given_a)
    assert objective["AG"] <= float(eq4_objective(brute, log_a_given_b, log_b_given_a)) + 1e-10
    np.testing.assert_allclose(ag.log_prob.exp(), brute.exp(), rtol=0, atol=1e-6)
    # Eq. 4 summed over both positions and all values is 2|V| times the A-KL of sec. 3.
    assert objective["AG"] == pytest.approx(2 * len(log_a_given_b) * pair_metrics(cond, ag.log_prob).a_kl, abs=1e-12)


def test_goyal_example_has_the_closed_form_ag_joint():
    """By symmetry the AG joint has uniform marginals, so eq. 5's fixed point is (q(i|j) + q(j|i)) / (2 + 2):
    (0.99 + 0.5) / 4 = 0.3725 on the diagonal, (0.01 + 0.5) / 4 = 0.1275 off it."""
    log_a_given_b, log_b_given_a = goyal_conditionals()
    joint = ag_joint(log_a_given_b, log_b_given_a).log_prob.exp()
    np.testing.assert_allclose(joint, [[0.3725, 0.1275], [0.1275, 0.3725]], rtol=0, atol=1e-12)


def test_ag_reports_the_change_of_its_last_iteration():
    """App. B's peaked joint converges slowly: 50 iterations (the paper's) leave a visible change."""
    cond = conditionals_of_joint(appendix_b_joint())
    changes = [ag_joint(cond.log_a_given_b, cond.log_b_given_a, n).change for n in (1, 50, 500, 5000)]
    assert changes[0] > changes[1] > changes[2] > changes[3] >= 0, changes
    assert changes[1] > 1e-5
    assert changes[3] < 1e-12
    assert score_pair(cond).ag_change == pytest.approx(changes[1], rel=1e-9)


def test_metrics_equal_their_definitions():
    log_a_given_b, log_b_given_a = random_incompatible(6, 7)
    generator = torch.Generator().manual_seed(8)
    cond = conditionals_of(
        log_a_given_b,
        log_b_given_a,
        torch.randn(6, dtype=F64, generator=generator).log_softmax(0),
        torch.randn(6, dtype=F64, generator=generator).log_softmax(0),
        gold=(4, 1),
    )
    scores = score_pair(cond)
    for name in CONSTRUCTIONS:
        got = scores.metrics[name]
        expected = joint_metrics(cond, construct(cond, name).log_prob, own_unary=name == "MLM")
        np.testing.assert_allclose(
            [got.log_pair, got.log_unary_a, got.log_unary_b, got.a_kl, got.g_kl],
            expected,
            rtol=0,
            atol=1e-12,
            err_msg=name,
        )
    mlm = scores.metrics["MLM"]
    assert mlm.log_pair == pytest.approx(float(cond.log_a[4] + cond.log_b[1]), abs=1e-12)


def test_mrf_logit_sums_raw_logits_and_the_mrf_does_not_see_them():
    """Shifting the logits of each unary pass changes MRF-L (summed logits) but no log-probability."""
    log_a_given_b, log_b_given_a = random_incompatible(5, 9)
    base = conditionals_of(log_a_given_b, log_b_given_a, log_a_given_b[:, 0], log_b_given_a[0])
    generator = torch.Generator().manual_seed(10)
    shifts = torch.randn(2, 5, dtype=F64, generator=generator) * 3
    shifted = dataclasses.replace(base, norm_a=shifts[0], norm_b=shifts[1])
    logits = (log_a_given_b + shifted.norm_a[None, :]) + (log_b_given_a + shifted.norm_b[:, None])
    np.testing.assert_allclose(construct(shifted, "MRF-L").log_prob, logits - logits.logsumexp((0, 1)), atol=1e-12)
    np.testing.assert_allclose(construct(shifted, "MRF").log_prob, construct(base, "MRF").log_prob, atol=1e-12)
    assert (construct(shifted, "MRF-L").log_prob - construct(base, "MRF-L").log_prob).abs().max() > 0.1


def test_peaked_float32_conditionals_stay_finite():
    """Log-probabilities far below float32's exp underflow (-104) must not produce inf or nan."""
    generator = torch.Generator().manual_seed(11)
    log_a_given_b = (torch.randn(40, 40, generator=generator) * 150).log_softmax(0)
    log_b_given_a = (torch.randn(40, 40, generator=generator) * 150).log_softmax(1)
    assert log_a_given_b.min() < -500
    cond = conditionals_of(log_a_given_b, log_b_given_a, log_a_given_b[:, 3], log_b_given_a[3], gold=(2, 5))
    scores = score_pair(cond)
    for name, m in scores.metrics.items():
        assert all(math.isfinite(x) for x in (m.log_pair, m.log_unary_a, m.log_unary_b, m.a_kl, m.g_kl)), name
        assert m.a_kl >= -1e-3 and m.g_kl >= -1e-3, (name, m)
    assert math.isfinite(scores.ag_change)


def test_corpus_figures_are_computed_once_from_summed_statistics():
    generator = torch.Generator().manual_seed(12)
    examples = []
    for seed in range(5):
        log_a_given_b, log_b_given_a = random_incompatible(4, 20 + seed)
        marginal = torch.randn(4, dtype=F64, generator=generator).log_softmax(0)
        gold = tuple(int(x) for x in torch.randint(0, 4, (2,), generator=generator))
        examples.append(score_pair(conditionals_of(log_a_given_b, log_b_given_a, marginal, marginal, gold)).metrics)
    totals = corpus_stats(examples)
    merged = corpus_stats(examples[:2])
    rest = corpus_stats(examples[2:])
    for name in CONSTRUCTIONS:
        ms = [e[name] for e in examples]
        stats = totals[name]
        assert stats.n == 5
        assert stats.p_ppl == pytest.approx(math.exp(-sum(m.log_pair for m in ms) / 10), rel=1e-12)
        assert stats.u_ppl == pytest.approx(math.exp(-sum(m.log_unary_a + m.log_unary_b for m in ms) / 10), rel=1e-12)
        assert stats.a_kl == pytest.approx(np.mean([m.a_kl for m in ms]), rel=1e-12)
        assert stats.g_kl == pytest.approx(np.mean([m.g_kl for m in ms]), rel=1e-12)
        combined = merged[name] + rest[name]
        assert combined.n == stats.n
        np.testing.assert_allclose(combined.astuple()[1:], stats.astuple()[1:], rtol=1e-12)
    assert JointStats().p_ppl is None and JointStats().a_kl is None


def test_options_and_pivots_outside_the_support_are_refused():
    with pytest.raises(UserError, match="pivot"):
        JointOptions(pivot="median")
    with pytest.raises(UserError, match="--ag-iterations 0 is out of bounds: it must be at least 1"):
        JointOptions(ag_iterations=0)
    cond = conditionals_of_joint(random_joint(3, 0))
    with pytest.raises(UserError, match="not among"):
        construct(cond, "HCB", JointOptions(pivot=7))
    with pytest.raises(UserError, match="construction"):
        construct(cond, "PMI")


def test_real_antiberty_joints_and_metrics_are_finite(offline_model_dir):
    """AntiBERTy (V = 25): the whole path, engine -> five joints -> metrics, on real weights."""
    from distributed_scoring.offline.antibodies import spaced, v_genes

    mlm = load_masked_lm(ModelSpec(str(offline_model_dir("antiberty"))))
    sequence = spaced(sorted(v_genes("human").values())[0][:30])
    (prepared,) = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts([sequence])
    pairs = [Pair(np.array(prepared.input_ids), np.array(prepared.targets), a, b) for a, b in [(10, 11), (25, 3)]]
    results = dict(ConditionalsEngine(mlm, batch_tokens=1024).conditionals(pairs))
    assert sorted(results) == [0, 1]
    examples = []
    for index, cond in results.items():
        assert cond.log_a_given_b.shape == (25, 25)
        scores = score_pair(cond)
        for name, m in scores.metrics.items():
            values = (m.log_pair, m.log_unary_a, m.log_unary_b, m.a_kl, m.g_kl)
            assert all(math.isfinite(x) for x in values), (index, name, m)
            assert m.log_pair < 0 and m.a_kl >= -1e-6 and m.g_kl >= -1e-6, (index, name, m)
        assert 0 < scores.ag_change < 1
        examples.append(scores.metrics)
        # Converged, AG minimises eq. 4, which is 2|V| A-KL: no construction is more faithful on average.
        # (After the default 50 iterations it need not be: these conditionals converge slowly.)
        a_kl = {name: m.a_kl for name, m in score_pair(cond, JointOptions(ag_iterations=5000)).metrics.items()}
        assert a_kl["AG"] <= min(a_kl.values()) + 1e-6, a_kl
    totals = corpus_stats(examples)
    for name in CONSTRUCTIONS:
        figures = totals[name].to_dict()
        assert all(math.isfinite(figures[k]) for k in ("p_ppl", "u_ppl", "a_kl", "g_kl")), (name, figures)
        assert 1 <= figures["u_ppl"] < 25 and figures["p_ppl"] >= 1, (name, figures)
