"""The infilling engine against brute force: a tiny model where every fill can be enumerated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.infill import InfillEngine, InfillExample, InfillSettings
from distributed_scoring.engine.masked_lm import load_masked_lm

from helpers.reference import NaiveInfill

TEXTS = ["the quick brown fox jumps over the lazy dog", "she sells seashells by the seashore"]


@pytest.fixture(scope="module")
def mlm(tiny_model_dir):
    return load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), dtype="float64"))


def example(mlm, text: str, masks: list[int], seed: int = 0) -> InfillExample:
    ids = np.array(mlm.tokenizer(text)["input_ids"], dtype=np.int64)
    ids[masks] = mlm.mask_token_id
    return InfillExample(ids, np.array(sorted(masks)), seed)


def allowed_of(mlm, ids: list[int]) -> np.ndarray:
    allowed = np.zeros(mlm.model.config.vocab_size, dtype=bool)
    allowed[ids] = True
    return allowed


def some_tokens(mlm, n: int) -> list[int]:
    """n ordinary (non-special) token ids."""
    specials = set(mlm.tokenizer.all_special_ids)
    return [t for t in range(len(mlm.tokenizer)) if t not in specials][5 : 5 + n]


def brute_force(mlm, ex: InfillExample, allowed: list[int], order: str, rank: str):
    fills = NaiveInfill(mlm.model, mlm.mask_token_id).fills(ex.input_ids.tolist(), ex.masks.tolist(), allowed, order)
    return sorted(fills, key=lambda f: f[1] if rank == "chain" else f[2], reverse=True)


@pytest.mark.parametrize("order", ["l2r", "best-to-worst"])
@pytest.mark.parametrize("decoder", ["standard", "hcb"])
def test_a_beam_as_wide_as_every_fill_is_the_brute_force_ranking(mlm, decoder, order):
    tokens = some_tokens(mlm, 6)
    ex = example(mlm, TEXTS[0], [2, 3, 5])
    got = InfillEngine(mlm, allowed_of(mlm, tokens), 256).search([ex], InfillSettings(decoder, order, beam=6**3))[0]
    want = brute_force(mlm, ex, tokens, order, "hcb" if decoder == "hcb" else "chain")
    assert len(got) == len(want) == 216
    assert [tuple(f.tokens.tolist()) for f in got] == [w[0] for w in want]
    np.testing.assert_allclose([f.chain for f in got], [w[1] for w in want], atol=1e-5, rtol=0)
    np.testing.assert_allclose([f.hcb for f in got], [w[2] for w in want], atol=1e-5, rtol=0)
    assert [f.order for f in got] == [w[3] for w in want]


def test_exact_enumerates_every_fill_of_the_whole_vocabulary(mlm):
    """No restriction but the special tokens: |V'|^2 fills, ranked by the chain score."""
    specials = set(mlm.tokenizer.all_special_ids)
    allowed = [t for t in range(len(mlm.tokenizer)) if t not in specials]
    ex = example(mlm, TEXTS[1], [2, 4])
    mask = np.zeros(mlm.model.config.vocab_size, dtype=bool)
    mask[allowed] = True
    got = InfillEngine(mlm, mask, 512).search([ex], InfillSettings("exact", "best-to-worst"))[0]
    want = brute_force(mlm, ex, allowed, "best-to-worst", "chain")
    assert len(got) == len(allowed) ** 2
    assert [tuple(f.tokens.tolist()) for f in got[:50]] == [w[0] for w in want[:50]]
    np.testing.assert_allclose([f.chain for f in got], [w[1] for w in want], atol=1e-5, rtol=0)


@pytest.mark.parametrize("decoder", ["standard", "hcb"])
def test_a_narrow_beam_returns_true_scores_of_fills_it_found(mlm, decoder):
    tokens = some_tokens(mlm, 8)
    ex = example(mlm, TEXTS[0], [1, 2, 4, 6])
    engine = InfillEngine(mlm, allowed_of(mlm, tokens), 256)
    got = engine.search([ex], InfillSettings(decoder, "best-to-worst", beam=3))[0]
    truth = {(w[0], w[3]): w for w in brute_force(mlm, ex, tokens, "best-to-worst", "chain")}
    assert len(got) == 3
    for fill in got:
        _, chain, hcb, _ = truth[(tuple(fill.tokens.tolist()), fill.order)]
        assert fill.chain == pytest.approx(chain, abs=1e-5) and fill.hcb == pytest.approx(hcb, abs=1e-5)
    scores = [f.hcb if decoder == "hcb" else f.chain for f in got]
    assert scores == sorted(scores, reverse=True)


def test_results_do_not_depend_on_batching(mlm):
    tokens = some_tokens(mlm, 5)
    examples = [example(mlm, TEXTS[0], [2, 3]), example(mlm, TEXTS[1], [1, 5, 6], seed=3)]
    for settings in (InfillSettings("hcb", "best-to-worst", beam=4), InfillSettings("top-p", "l2r", beam=3, top_p=0.8)):
        together = InfillEngine(mlm, allowed_of(mlm, tokens), 4096).search(examples, settings)
        alone = [InfillEngine(mlm, allowed_of(mlm, tokens), 16).search([e], settings)[0] for e in examples]
        for a, b in zip(together, alone):
            assert [f.tokens.tolist() for f in a] == [f.tokens.tolist() for f in b]
            np.testing.assert_allclose([f.chain for f in a], [f.chain for f in b], atol=1e-9)


def test_special_tokens_are_never_filled(mlm):
    specials = set(mlm.tokenizer.all_special_ids)
    allowed = np.zeros(mlm.model.config.vocab_size, dtype=bool)
    allowed[[t for t in range(len(mlm.tokenizer)) if t not in specials]] = True
    ex = example(mlm, TEXTS[0], [1, 2, 3])
    for decoder in ("standard", "hcb", "sample", "temperature"):
        for fill in InfillEngine(mlm, allowed).search([ex], InfillSettings(decoder, beam=8))[0]:
            assert not specials & set(fill.tokens.tolist())


@pytest.mark.parametrize("decoder", ["sample", "temperature", "top-k", "top-p"])
def test_samplers_score_their_chains_exactly_and_are_seeded(mlm, decoder):
    tokens = some_tokens(mlm, 7)
    ex = example(mlm, TEXTS[1], [2, 3, 4], seed=11)
    settings = InfillSettings(decoder, "l2r", beam=4, temperature=0.5, top_k=3, top_p=0.7)
    engine = InfillEngine(mlm, allowed_of(mlm, tokens), 512)
    got = engine.search([ex], settings)[0]
    again = engine.search([ex], settings)[0]
    assert [f.tokens.tolist() for f in got] == [f.tokens.tolist() for f in again]
    first = {f.tokens[0] for f in got}
    assert len(first) == len(got)  # distinct first tokens: drawn without replacement
    truth = {w[0]: w for w in brute_force(mlm, ex, tokens, "l2r", "chain")}
    for fill in got:
        assert fill.chain == pytest.approx(truth[tuple(fill.tokens.tolist())][1], abs=1e-5)
    assert [f.chain for f in got] == sorted((f.chain for f in got), reverse=True)


def test_a_sampler_draws_from_its_filtered_distribution(mlm):
    """2,000 one-token chains of one context: the frequencies follow softmax(log p / T) over the allowed
    tokens (a chi-square test at 0.1%, fixed seeds, so the test is deterministic)."""
    tokens = some_tokens(mlm, 5)
    ex = example(mlm, TEXTS[0], [3])
    examples = [InfillExample(ex.input_ids, ex.masks, seed) for seed in range(2000)]
    engine = InfillEngine(mlm, allowed_of(mlm, tokens), 1 << 16)
    fills = engine.search(examples, InfillSettings("temperature", beam=1, temperature=0.5))
    counts = np.array([sum(f[0].tokens[0] == t for f in fills) for t in tokens])
    logp = NaiveInfill(mlm.model, mlm.mask_token_id).logp(tuple(ex.input_ids.tolist()))[3, tokens] / 0.5
    expected = 2000 * np.exp(logp - np.logaddexp.reduce(logp))
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47  # chi-square, 4 degrees of freedom, p = 0.001


def test_top_k_of_one_and_a_tiny_top_p_are_greedy(mlm):
    tokens = some_tokens(mlm, 6)
    ex = example(mlm, TEXTS[0], [2, 4])
    engine = InfillEngine(mlm, allowed_of(mlm, tokens))
    greedy = engine.search([ex], InfillSettings("standard", beam=1))[0][0]
    for settings in (InfillSettings("top-k", beam=1, top_k=1), InfillSettings("top-p", beam=1, top_p=1e-6)):
        assert engine.search([ex], settings)[0][0].tokens.tolist() == greedy.tokens.tolist()


@dataclass
class ConstructedLM:
    """A masked LM whose log-probabilities are written by hand: at each masked position, a table that
    depends on nothing else, so best-to-worst's order can be worked out on paper."""

    tables: dict[int, list[float]]  # position -> logits over a 4-token vocabulary
    mask_token_id: int = 3
    pad_token_id: int = 3
    device: torch.device = torch.device("cpu")

    def default_batch_tokens(self) -> int:
        return 64

    def logits_at(self, input_ids, attention_mask, positions, rows=None):
        yield torch.tensor([self.tables[int(p)] for p in positions], dtype=torch.float64)


def test_best_to_worst_fills_the_most_confident_position_first_ties_to_the_leftmost():
    # position 1: peak log p of 0.5-ish; position 2: sharper; position 3: as sharp as 2 (a tie).
    lm = ConstructedLM({1: [1.0, 0.0, 0.0, -9.0], 2: [4.0, 0.0, 0.0, -9.0], 3: [0.0, 4.0, 0.0, -9.0]})
    allowed = np.array([True, True, True, False])
    ex = InfillExample(np.array([0, 3, 3, 3, 0]), np.array([1, 2, 3]))
    fill = InfillEngine(lm, allowed).search([ex], InfillSettings("standard", "best-to-worst", beam=1))[0][0]
    assert fill.order == (2, 3, 1)  # 2 and 3 tie on the sharpest peak: the leftmost first; 1 last
    assert fill.tokens.tolist() == [0, 0, 1]
    logp = {p: torch.log_softmax(torch.tensor(t, dtype=torch.float64), 0).numpy() for p, t in lm.tables.items()}
    assert fill.chain == pytest.approx(logp[2][0] + logp[3][1] + logp[1][0], abs=1e-12)
    assert fill.hcb == pytest.approx(fill.chain - logp[2][3] - logp[3][3] - logp[1][3], abs=1e-12)
    l2r = InfillEngine(lm, allowed).search([ex], InfillSettings("standard", "l2r", beam=1))[0][0]
    assert l2r.order == (1, 2, 3)


def test_progress_is_reported_after_every_step_of_the_search(mlm):
    tokens = some_tokens(mlm, 5)
    examples = [example(mlm, TEXTS[0], [2, 3]), example(mlm, TEXTS[1], [1, 5, 6], seed=3)]
    reports: list[tuple[int, int]] = []
    InfillEngine(mlm, allowed_of(mlm, tokens), 64).search(
        examples, InfillSettings("standard", "l2r", beam=2), lambda done, total: reports.append((done, total))
    )
    assert reports == [(1, 3), (2, 3), (3, 3)]  # one position of every unfinished example per step
