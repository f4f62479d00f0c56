"""The MH sampler (Goyal et al., 2022) against brute force: every state of a tiny problem enumerated.

A tiny random BERT in float64, 3 of the 5 tokens of a sequence sampled over 4 allowed tokens (64
states) while the other 2 stay as context (the energy sums over all 5 positions):
the exact target p(X) ∝ exp(-E(X) / T) comes from `reference.NaiveEnergy`, one masked copy per
forward pass. A hand-built MLM with the paper's incompatible conditionals (appendix C) shows that
degenerate Gibbs samples something else.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.energy import EnergyEngine, sequence_positions
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.sampler import Chain, Sampler, Step
from distributed_scoring.engine.sampler_settings import SamplerSettings

from helpers.reference import NaiveEnergy, total_variation

TEXT = "the lazy dog"
PROBLEM_IDS = (84, 131, 69, 65, 201)  # one session's "the la ##z ##y dog"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The chains' forward passes are tiny (a few dozen distinct rows): one intra-op thread is as fast
    on an idle machine and much faster on a busy one, where a second thread spins waiting for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mlm(tiny_model_dir):
    return load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))


@pytest.fixture(scope="module")
def naive(mlm):
    return NaiveEnergy(mlm.model, mlm.mask_token_id)


def ordinary(mlm, n: int, skip: int = 5) -> list[int]:
    specials = set(mlm.tokenizer.all_special_ids)
    return [t for t in range(len(mlm.tokenizer)) if t not in specials][skip : skip + n]


def allowed_of(mlm, ids: list[int]) -> np.ndarray:
    allowed = np.zeros(mlm.model.config.vocab_size, dtype=bool)
    allowed[ids] = True
    return allowed


def problem(mlm):
    """(input ids, sampled positions, scored positions): [CLS] a b c d e [SEP], a b c sampled, d e kept.

    Fixed ids rather than a tokenised text: the tiny tokenizer is trained afresh each session and its
    ids move, while the seeded weights only see ids, so fixed ids make the same problem every time."""
    t = mlm.tokenizer
    ids = np.array([t.cls_token_id, *PROBLEM_IDS, t.sep_token_id], dtype=np.int64)
    assert not set(PROBLEM_IDS) & set(t.all_special_ids)
    scored = sequence_positions(mlm, ids)
    assert scored.tolist() == [1, 2, 3, 4, 5]
    return ids, scored[:3], scored


def empirical(records, sample) -> dict:
    counts = Counter(tuple(r[-1].ids[sample].tolist()) for r in records)
    return {state: c / len(records) for state, c in counts.items()}


def tv_bound(target: dict, n: int, delta: float = 1e-3) -> float:
    """A bound that the TV between p and the empirical law of n independent draws from p exceeds with
    probability at most delta: E TV = 1/2 sum_k E|p^_k - p_k| <= 1/2 sum_k sqrt(p_k (1 - p_k) / n)
    (Jensen), and TV moves by at most 1/n when one draw changes, so by McDiarmid
    P(TV >= E TV + eps) <= exp(-2 n eps^2), i.e. eps = sqrt(log(1 / delta) / (2 n)). For K equal
    probabilities the first term is about sqrt(K / 4n)."""
    mean = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in target.values())
    return mean + math.sqrt(math.log(1 / delta) / (2 * n))


# --- energies ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [9, 60, 1 << 16])
def test_energies_equal_the_naive_reference_in_float64(mlm, naive, budget):
    """Sequences of three lengths, some with a fixed context outside the scored positions; a budget of
    9 tokens splits every sequence's masked copies over several passes."""
    texts = [TEXT, "she sells seashells by the seashore", "the dog"]
    seqs = [np.array(mlm.tokenizer(t)["input_ids"], dtype=np.int64) for t in texts]
    scored = [sequence_positions(mlm, s) for s in seqs]
    scored[1] = scored[1][2:]  # an energy over part of the sequence only
    raw, norm = EnergyEngine(mlm, budget).energies(seqs, scored)
    want = np.array([naive.energies(s.tolist(), p.tolist()) for s, p in zip(seqs, scored)])
    np.testing.assert_allclose(raw, want[:, 0], rtol=0, atol=1e-8)
    np.testing.assert_allclose(norm, want[:, 1], rtol=0, atol=1e-8)
    assert min(np.ptp(raw), np.ptp(norm)) > 0.01  # the energies differ (by far more than the tolerance)


def test_energies_in_float32_equal_the_float64_reference(tiny_model_dir, naive):
    mlm32 = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    seqs = [np.array(mlm32.tokenizer(t)["input_ids"], dtype=np.int64) for t in (TEXT, "the quick brown fox")]
    scored = [sequence_positions(mlm32, s) for s in seqs]
    raw, norm = EnergyEngine(mlm32, 40).energies(seqs, scored)
    want = np.array([naive.energies(s.tolist(), p.tolist()) for s, p in zip(seqs, scored)])
    np.testing.assert_allclose(raw, want[:, 0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(norm, want[:, 1], rtol=0, atol=1e-5)


# --- single proposals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampler,block,start", [("mh", 1, "random"), ("block-mh", 2, "random"), ("block-mh", 3, "warm")]
)
def test_every_acceptance_equals_the_naive_reference(mlm, naive, sampler, block, start):
    """Shaped proposals (tau = 0.7, top-p = 0.8 over 10 tokens, so some random start tokens fall outside
    the nucleus and moves away from them get log a = -inf), an annealed target temperature: every traced
    step's q(X'|X), q(X|X'), energies and log a equal the float64 reference to 1e-6. (A random start
    wholly outside the nucleus of a block that covers every sampled position could never move: the
    3-block chains start warm.)"""
    ids, sample, scored = problem(mlm)
    tokens = ordinary(mlm, 10)
    settings = SamplerSettings(
        sampler=sampler,
        energy="raw" if block == 2 else "norm",
        epochs=2,
        burn_in=1,
        block=block,
        proposal_temperature=0.7,
        top_p=0.8,
        target_temperature=1.5,
        anneal=0.4,
        order="random",
        start=start,
    )
    steps: list[Step] = []
    Sampler(mlm, allowed_of(mlm, tokens), 64).run(
        [Chain(ids, sample, scored, s) for s in range(8)], settings, steps.append
    )
    assert len(steps) == 8 * 3 * -(-3 // block)
    assert sorted({s.target_temperature for s in steps}, reverse=True) == pytest.approx([1.5, 1.1, 0.7])
    changed = 0
    for s in steps:
        block_ = list(s.block)
        forward = naive.proposal(s.current.tolist(), block_, tokens, 0.7, 0.8)
        reverse = naive.proposal(s.proposed.tolist(), block_, tokens, 0.7, 0.8)
        log_fwd = sum(forward[k][tokens.index(s.proposed[i])] for k, i in enumerate(block_))
        log_rev = sum(reverse[k][tokens.index(s.current[i])] for k, i in enumerate(block_))
        assert s.log_q_forward == pytest.approx(log_fwd, abs=1e-6)
        assert s.log_q_reverse == pytest.approx(log_rev, abs=1e-6) or s.log_q_reverse == log_rev == -np.inf
        np.testing.assert_allclose(s.energy_current, naive.energies(s.current.tolist(), scored.tolist()), atol=1e-8)
        np.testing.assert_allclose(s.energy_proposed, naive.energies(s.proposed.tolist(), scored.tolist()), atol=1e-8)
        want = naive.log_acceptance(
            s.current.tolist(),
            s.proposed.tolist(),
            block_,
            scored.tolist(),
            tokens,
            settings.energy,
            s.target_temperature,
            0.7,
            0.8,
        )
        assert s.log_acceptance == pytest.approx(want, abs=1e-6) or s.log_acceptance == want == -np.inf
        changed += not np.array_equal(s.current, s.proposed)
    assert changed > len(steps) // 3
    assert any(s.log_acceptance == -np.inf for s in steps) or start == "warm"
    assert any(-5 < s.log_acceptance < -1e-3 for s in steps)  # some genuinely partial acceptances


# --- the target distribution ----------------------------------------------------------------------------

# (sampler, block, energy, T, order): every sampler meets both energies and both temperatures.
CONFIGS = [
    ("mh", 1, "raw", 1.0, "random"),
    ("mh", 1, "norm", 1.0, "sweep"),
    ("mh", 1, "raw", 0.5, "sweep"),
    ("mh", 1, "norm", 0.5, "random"),
    ("block-mh", 2, "raw", 1.0, "sweep"),
    ("block-mh", 3, "norm", 1.0, "random"),
    ("block-mh", 3, "raw", 0.5, "sweep"),
    ("block-mh", 2, "norm", 0.5, "random"),
]
CHAINS = 3000


@pytest.fixture(scope="module")
def targets(mlm, naive):
    ids, sample, scored = problem(mlm)
    tokens = ordinary(mlm, 4)
    return {
        (e, t): naive.target(ids.tolist(), sample.tolist(), scored.tolist(), tokens, e, t)
        for e in ("raw", "norm")
        for t in (1.0, 0.5)
    }


@pytest.mark.parametrize("sampler,block,energy,temperature,order", CONFIGS)
def test_final_states_of_independent_chains_follow_the_target(mlm, targets, sampler, block, energy, temperature, order):
    """3,000 independent chains from uniform random starts, 8 epochs each (7 burn-in), final states only
    (independent draws from the chains' 8-epoch law, no autocorrelation). The TV to the exact target
    must stay below `tv_bound` at delta = 1e-3 (0.088 at T = 1, 0.062 at T = 0.5; the 8-epoch law's own
    distance to the target adds to the empirical TV and is part of what is tested). Measured: 0.016-0.048.
    For scale: sweep Gibbs's stationary law is 0.07-0.08 (T = 1) and 0.40-0.42 (T = 0.5) from these
    targets, and MH without the proposal ratio q(X|X')/q(X'|X) lands 0.18-0.43 away."""
    ids, sample, scored = problem(mlm)
    target = targets[(energy, temperature)]
    assert len(target) == 64
    settings = SamplerSettings(
        sampler=sampler,
        block=block,
        energy=energy,
        target_temperature=temperature,
        epochs=1,
        burn_in=7,
        order=order,
        start="random",
    )
    chains = [Chain(ids, sample, scored, seed) for seed in range(CHAINS)]
    records = Sampler(mlm, allowed_of(mlm, ordinary(mlm, 4)), 1 << 14).run(chains, settings)
    tv, bound = total_variation(empirical(records, sample), target), tv_bound(target, CHAINS)
    assert tv < bound, f"TV {tv:.4f} >= bound {bound:.4f}"


@dataclass
class IncompatibleLM:
    """Goyal et al.'s appendix C counterexample as a masked LM over [CLS] x1 x2 [SEP], x in {a, b}:
    p(x1 | x2) = [[.99, .01], [.01, .99]], p(x2 | x1) = [.5, .5]. Ids: a = 0, b = 1, [MASK] = 2,
    [CLS]/[SEP]/[PAD] = 3; specials get logit -50. No joint has these conditionals; E_norm's target is
    p(x) ∝ p(x1 | x2) / 2 = {aa: .495, ab: .005, ba: .005, bb: .495}. Sweep Gibbs (x1, then x2) ends
    each epoch with x2 uniform and independent of x1: uniform over the 4 states, TV .49 from the target."""

    mask_token_id: int = 2
    pad_token_id: int = 3
    device: torch.device = torch.device("cpu")

    def default_batch_tokens(self) -> int:
        return 1024

    def logits_at(self, input_ids, attention_mask, positions, rows=None):
        rows = np.arange(len(positions)) if rows is None else rows
        out = []
        for r, p in zip(rows, positions):
            if p == 1:
                other = input_ids[r, 2]
                probs = {0: [0.99, 0.01], 1: [0.01, 0.99]}.get(other, [0.5, 0.5])
            else:
                probs = [0.5, 0.5]
            out.append(np.log(probs).tolist() + [-50.0, -50.0])
        yield torch.tensor(out, dtype=torch.float64)


def test_degenerate_gibbs_misses_the_target_that_mh_reaches():
    lm = IncompatibleLM()
    ids, sample, scored = np.array([3, 0, 0, 3]), np.array([1, 2]), np.array([1, 2])
    target = {(0, 0): 0.495, (0, 1): 0.005, (1, 0): 0.005, (1, 1): 0.495}
    uniform = dict.fromkeys(target, 0.25)
    n = 2000
    bound = tv_bound(target, n)
    chains = [Chain(ids, sample, scored, seed) for seed in range(n)]
    allowed = np.array([True, True, False, False])
    got = {}
    for sampler, block in (("gibbs", 1), ("mh", 1), ("block-mh", 2)):
        settings = SamplerSettings(sampler=sampler, block=block, energy="norm", epochs=1, burn_in=5, start="random")
        got[sampler] = empirical(Sampler(lm, allowed).run(chains, settings), sample)
    assert total_variation(got["gibbs"], uniform) < tv_bound(uniform, n)
    assert total_variation(got["gibbs"], target) > 0.49 - tv_bound(uniform, n) > 4 * bound
    assert total_variation(got["mh"], target) < bound
    assert total_variation(got["block-mh"], target) < bound


# --- batching, seeds, tokens, schedules -------------------------------------------------------------------


def test_results_do_not_depend_on_batching(mlm):
    ids, sample, scored = problem(mlm)
    other = np.array(mlm.tokenizer("she sells seashells")["input_ids"], dtype=np.int64)
    other_scored = sequence_positions(mlm, other)
    chains = [
        Chain(ids, sample, scored, 1),
        Chain(other, other_scored[1:4], other_scored, 2),
        Chain(ids, sample[:2], scored, 3),
    ]
    allowed = allowed_of(mlm, ordinary(mlm, 30))
    for settings in (
        SamplerSettings("mh", "norm", epochs=3, order="random", start="random", proposal_temperature=2),
        SamplerSettings("block-mh", "raw", epochs=2, block=2, start="warm", top_p=0.9),
    ):
        together = Sampler(mlm, allowed, 1 << 14).run(chains, settings)
        alone = [Sampler(mlm, allowed, 10, cache_states=0).run([c], settings)[0] for c in chains]
        for a, b in zip(together, alone):
            assert [r.ids.tolist() for r in a] == [r.ids.tolist() for r in b]
            assert [(r.accepted, r.novel, r.proposals) for r in a] == [(r.accepted, r.novel, r.proposals) for r in b]
            np.testing.assert_allclose([r.energy_norm for r in a], [r.energy_norm for r in b], atol=1e-9)
        again = Sampler(mlm, allowed, 77).run(chains, settings)
        assert [[r.ids.tolist() for r in c] for c in again] == [[r.ids.tolist() for r in c] for c in together]


def test_special_tokens_are_never_proposed(mlm):
    """Every non-special token allowed, a masked input, proposals at a hot proposal temperature."""
    ids = np.array(mlm.tokenizer("the quick brown fox")["input_ids"], dtype=np.int64)
    scored = sequence_positions(mlm, ids)
    ids[scored[1:4]] = mlm.mask_token_id
    specials = set(mlm.tokenizer.all_special_ids)
    allowed = allowed_of(mlm, [t for t in range(len(mlm.tokenizer)) if t not in specials])
    for sampler, start in (("gibbs", "random"), ("mh", "warm"), ("block-mh", "random")):
        steps: list[Step] = []
        settings = SamplerSettings(
            sampler, epochs=2, block=1 if sampler == "mh" else 3, start=start, proposal_temperature=5.0
        )
        records = Sampler(mlm, allowed).run(
            [Chain(ids, scored[1:4], scored, s) for s in range(3)], settings, steps.append
        )
        assert len(steps) >= 6
        for s in steps:
            assert not specials & set(s.proposed[scored[1:4]].tolist())
        for chain in records:
            assert not specials & set(chain[-1].ids[scored].tolist())
    with pytest.raises(ValueError, match="given"):  # a masked input cannot be a start as given
        Sampler(mlm, allowed).run([Chain(ids, scored[1:4], scored)], SamplerSettings(start="given"))


def test_warm_start_is_the_greedy_fill_of_the_masked_positions(mlm, naive):
    ids, sample, scored = problem(mlm)
    tokens = ordinary(mlm, 12)
    steps: list[Step] = []
    Sampler(mlm, allowed_of(mlm, tokens)).run(
        [Chain(ids, sample, scored)], SamplerSettings(epochs=1, start="warm"), steps.append
    )
    logits = naive.logits(naive.masked(ids.tolist(), sample.tolist()))
    greedy = [tokens[int(np.argmax(logits[p][tokens]))] for p in sample]
    assert steps[0].current[sample].tolist() == greedy


def test_records_count_proposals_and_follow_the_schedules(mlm):
    ids, sample, scored = problem(mlm)
    settings = SamplerSettings(
        "block-mh",
        epochs=5,
        burn_in=2,
        record_every=2,
        block=3,
        block_decay=1,
        target_temperature=1.0,
        anneal=0.3,
        min_target_temperature=0.05,
        start="random",
    )
    assert [settings.target_temperature_at(e) for e in range(1, 8)] == pytest.approx(
        [1.0, 0.7, 0.4, 0.1, 0.05, 0.05, 0.05]
    )
    assert [settings.block_at(e) for e in range(1, 5)] == [3, 2, 1, 1]
    steps: list[Step] = []
    records = Sampler(mlm, allowed_of(mlm, ordinary(mlm, 6))).run(
        [Chain(ids, sample, scored, 5)], settings, steps.append
    )[0]
    assert [r.epoch for r in records] == [4, 6, 7]  # every 2nd epoch after burn-in, and the last
    assert [r.target_temperature for r in records] == pytest.approx([0.1, 0.05, 0.05])
    assert [len(s.block) for s in steps][:6] == [3, 2, 1, 1, 1, 1]  # 1 block, then 2, then 3 per epoch
    # epochs 1-4 make 1 + 2 + 3 + 3 proposals, epochs 5-6 make 6, epoch 7 makes 3
    assert [r.proposals for r in records] == [9, 6, 3]
    for r in records:
        assert 0 <= r.novel <= r.accepted <= r.proposals
    assert sum(r.accepted for r in records) == sum(s.accepted for s in steps)
    assert sum(r.novel for r in records) == sum(s.accepted and not np.array_equal(s.current, s.proposed) for s in steps)
    gibbs = Sampler(mlm, allowed_of(mlm, ordinary(mlm, 6))).run(
        [Chain(ids, sample, scored, 5)], SamplerSettings("gibbs", epochs=2, start="random")
    )[0]
    assert all(r.accepted == r.proposals == 3 for r in gibbs)
    with pytest.raises(ValueError):
        SamplerSettings("mh", block=2)


def test_forced_epochs_are_gibbs_moves_then_mh_resumes(mlm, targets):
    """The paper's trick after a warm start: the first `forced_accept` epochs accept every proposal. Those
    epochs are exactly the Gibbs sampler's (same draws, same states), later ones are MH again (partial
    acceptances), and with the forced epochs inside the burn-in the chains still reach the target."""
    ids, sample, scored = problem(mlm)
    allowed = allowed_of(mlm, ordinary(mlm, 4))
    chains = [Chain(ids, sample, scored, seed) for seed in range(40)]
    forced = SamplerSettings("mh", "raw", epochs=2, start="random", forced_accept=2, record_every=1)
    gibbs = SamplerSettings("gibbs", "raw", epochs=2, start="random")
    a, b = Sampler(mlm, allowed).run(chains, forced), Sampler(mlm, allowed).run(chains, gibbs)
    assert [[r.ids.tolist() for r in c] for c in a] == [[r.ids.tolist() for r in c] for c in b]
    assert all(r.accepted == r.proposals for c in a for r in c)
    steps: list[Step] = []
    Sampler(mlm, allowed).run(chains[:10], replace(forced, epochs=6), steps.append)
    assert all(s.accepted and s.log_acceptance == 0 for s in steps if s.epoch <= 2)
    assert any(not s.accepted for s in steps if s.epoch > 2)
    settings = SamplerSettings("mh", "raw", epochs=1, burn_in=7, start="random", forced_accept=2)
    many = [Chain(ids, sample, scored, seed) for seed in range(CHAINS)]
    target = targets[("raw", 1.0)]
    tv = total_variation(empirical(Sampler(mlm, allowed, 1 << 14).run(many, settings), sample), target)
    assert tv < tv_bound(target, CHAINS)


def test_progress_is_reported_after_every_step(mlm):
    ids, sample, scored = problem(mlm)
    reports: list[tuple[int, int]] = []
    settings = SamplerSettings("mh", "norm", epochs=2, burn_in=1, start="random")
    Sampler(mlm, allowed_of(mlm, ordinary(mlm, 30)), 1 << 14).run(
        [Chain(ids, sample, scored, 1)], settings, report=lambda done, total: reports.append((done, total))
    )
    steps = len(sample)  # mh: one position per step, every sampled position once per epoch
    assert reports == [(k, 3 * steps) for k in range(1, 3 * steps + 1)]
