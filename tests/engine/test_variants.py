"""The site tables of variant effects (`engine.variants.SiteEngine`, `PLLEngine.token_table`) and the four scores
made from them (Meier et al., 2021; ProteinGym), against the naive reference, on tiny protein models with one
token per residue (a BERT and an ESM-2 with its token dropout).

A variant's marginal score is a sum over its sites of table[site, mutant] - table[site, wild type]; the
tables are what the engine computes, so each is checked entry by entry and then through the scores, and the
passes they cost are counted, by the engine and by a hook on the encoder itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import MaskedLM, load_masked_lm
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.engine.variants import SiteEngine

from helpers import tiny
from helpers.reference import NaiveVariants, Site, mutant_of


def random_protein(length: int, seed: int) -> str:
    return "".join(np.random.default_rng(seed).choice(list(tiny.AMINO_ACIDS), length))


# Distinct lengths (so a batch's rows of different lengths are different sentences), longest first.
WILD_TYPES = [random_protein(n, seed) for seed, n in enumerate((31, 23, 12, 7))]
# 100 tokens: 3 copies of the longest sentence (33 tokens) per pass, so its 31 copies run over 11 passes, the
# last shared with the next sentence's; the 4 unmasked sequences go 3 + 1.
SMALL_BUDGET = 100
BUDGETS = (SMALL_BUDGET, 10**6)
TOLERANCE = 1e-5  # float32 engine against the float64 reference, as in test_pll.py
STRATEGIES = ("wt-marginal", "masked-marginal", "mutant-marginal", "pll")


def load(folder, dtype: str = "float32") -> MaskedLM:
    return load_masked_lm(ModelSpec(str(folder), device="cpu", dtype=dtype))


def alphabet_ids(mlm: MaskedLM) -> np.ndarray:
    """The tables' columns: the token id of each of the 20 amino acids, in `tiny.AMINO_ACIDS` order."""
    ids = np.array(mlm.tokenizer.convert_tokens_to_ids(list(tiny.AMINO_ACIDS)), dtype=np.int64)
    assert mlm.tokenizer.unk_token_id not in ids
    return ids


def sentence_of(mlm: MaskedLM, sequence: str, residues: list[int] | None = None) -> Sentence:
    """The engine's input straight from the tokenizer (residues separated by spaces, one word each): the tokens
    of `residues` (all, in order, by default) as targets, in the order given."""
    encoding = mlm.tokenizer(" ".join(sequence))
    words = encoding.word_ids()
    token_of = {word: t for t, word in enumerate(words) if word is not None}
    assert len(token_of) == len(sequence), "one token per residue"
    residues = list(range(len(sequence))) if residues is None else residues
    return Sentence(
        np.array(encoding["input_ids"], dtype=np.int64),
        np.array([token_of[i] for i in residues], dtype=np.int64),
        np.array([-1 if w is None else w for w in words], dtype=np.int64),
    )


class EncoderCalls:
    """The sequences of every call of the model's encoder, by a hook on the module itself (so independent of the
    engine's own counters): `rows[k]` are the lengths (attention-mask sums) of call k's rows."""

    def __init__(self, mlm: MaskedLM) -> None:
        self.module = mlm.model.base_model
        self.rows: list[list[int]] = []

    def record(self, module, args, kwargs) -> None:
        self.rows.append(kwargs["attention_mask"].sum(1).tolist())

    def __enter__(self) -> EncoderCalls:
        self.handle = self.module.register_forward_pre_hook(self.record, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    @property
    def passes(self) -> int:
        return sum(len(rows) for rows in self.rows)


def site_score(table: np.ndarray, sites: list[Site], slots: list[int]) -> float:
    """sum over sites of table[slot, mt] - table[slot, wt]: a variant's marginal from its sequence's table,
    `slots[k]` the table row of site k."""
    column = {residue: j for j, residue in enumerate(tiny.AMINO_ACIDS)}
    return float(sum(table[s, column[mt]] - table[s, column[wt]] for s, (_, wt, mt) in zip(slots, sites)))


@pytest.mark.parametrize("family", tiny.PROTEIN_FAMILIES)
def test_site_tables_equal_the_naive_reference(family, tiny_protein_dir):
    """Masked and unmasked tables of several sequences in one call, at every budget: equal to the naive
    conditionals at each residue, whatever the packing; `passes` and `batches` are the encoder's real calls.
    One sentence has a few targets out of order: a table is in target order, not position order."""
    mlm = load(tiny_protein_dir(family))
    naive = NaiveVariants(mlm.model, mlm.tokenizer)
    ids = alphabet_ids(mlm)
    subset = [5, 0, 11, 3]
    sentences = [sentence_of(mlm, w) for w in WILD_TYPES] + [sentence_of(mlm, WILD_TYPES[0], subset)]
    residues = [list(range(len(w))) for w in WILD_TYPES] + [subset]
    sequences = WILD_TYPES + [WILD_TYPES[0]]
    expected = {
        masked: [naive.conditionals(s, masked)[r][:, ids] for s, r in zip(sequences, residues)]
        for masked in (True, False)
    }
    assert np.concatenate(expected[True]).std() > 0.3, "conditionals too flat for the comparison to mean anything"
    assert np.abs(expected[True][0] - expected[False][0]).max() > 0.1, "masking must show in the numbers"
    copies = sum(len(s.targets) for s in sentences)
    longest = len(sentences[0].input_ids)
    got: dict[tuple[bool, int], list[np.ndarray]] = {}
    for budget in BUDGETS:
        for masked in (True, False):
            engine = SiteEngine(mlm, budget)
            with EncoderCalls(mlm) as calls:
                got[masked, budget] = (engine.masked if masked else engine.unmasked)(sentences, ids)
            assert engine.passes == calls.passes == (copies if masked else len(sentences)), (masked, budget)
            assert engine.batches == len(calls.rows), (masked, budget)
            for k, (g, e) in enumerate(zip(got[masked, budget], expected[masked])):
                assert g.shape == e.shape == (len(residues[k]), len(ids))
                np.testing.assert_allclose(
                    g, e, rtol=0, atol=TOLERANCE, err_msg=f"{family} masked={masked} budget={budget} sentence {k}"
                )
            if budget == SMALL_BUDGET:
                assert any(len(set(rows)) > 1 for rows in calls.rows), "some pass packs several sentences"
                if masked:
                    assert sum(longest in rows for rows in calls.rows) > 1, "a sentence's copies run over passes"
            else:
                assert engine.batches == 1
    for masked in (True, False):
        for small, large in zip(got[masked, BUDGETS[0]], got[masked, BUDGETS[1]]):
            np.testing.assert_allclose(small, large, rtol=0, atol=TOLERANCE)


def reported(method, sentences: list[Sentence], ids: np.ndarray) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """`method`'s tables, and the (done, total) it reported after each pass."""
    reports: list[tuple[int, int]] = []
    return method(sentences, ids, lambda done, total: reports.append((done, total))), reports


@pytest.mark.parametrize("family", tiny.PROTEIN_FAMILIES)
def test_site_tables_do_not_depend_on_the_batching(family, tiny_protein_dir):
    """In float64 packing, padding and gathering are exact: every budget (1 token: a copy per pass) gives the
    same tables to rounding, and the progress reports rise to the tokens of all the rows."""
    mlm = load(tiny_protein_dir(family), "float64")
    ids = alphabet_ids(mlm)
    sentences = [sentence_of(mlm, w) for w in WILD_TYPES]
    for method in ("masked", "unmasked"):
        copies = [len(s.targets) if method == "masked" else 1 for s in sentences]
        total = sum(len(s.input_ids) * n for s, n in zip(sentences, copies))
        tables = []
        for budget in (1, 50, SMALL_BUDGET, 10**6):
            table, reports = reported(getattr(SiteEngine(mlm, budget), method), sentences, ids)
            tables.append(table)
            assert {t for _, t in reports} == {total} and reports[-1] == (total, total), (method, budget)
            assert all(a < b for (a, _), (b, _) in zip(reports, reports[1:])), (method, budget)
        for other in tables[1:]:
            for a, b in zip(tables[0], other):
                np.testing.assert_allclose(b, a, rtol=0, atol=1e-12, err_msg=method)


@pytest.mark.parametrize("family", tiny.PROTEIN_FAMILIES)
def test_token_table_rows_are_the_pll_terms(family, tiny_protein_dir):
    """Over the whole vocabulary, each row of `token_table` is a log-softmax (it sums to 1) and its entry at the
    label is the PLL's term, from as many passes and batches as `token_logprobs` takes."""
    mlm = load(tiny_protein_dir(family))
    sentences = [sentence_of(mlm, w) for w in WILD_TYPES]
    vocabulary = np.arange(mlm.model.config.vocab_size)
    engine = PLLEngine(mlm, "original", SMALL_BUDGET)
    terms = engine.token_logprobs(sentences)
    passes, batches = engine.passes, engine.batches
    assert passes == sum(len(s.targets) for s in sentences) and batches > len(sentences)
    tables = engine.token_table(sentences, vocabulary)
    assert (engine.passes, engine.batches) == (2 * passes, 2 * batches)
    for s, term, table in zip(sentences, terms, tables):
        assert table.shape == (len(s.targets), len(vocabulary))
        np.testing.assert_allclose(np.logaddexp.reduce(table, axis=1), 0.0, rtol=0, atol=1e-5)
        np.testing.assert_allclose(table[np.arange(len(term)), s.input_ids[s.targets]], term, rtol=0, atol=1e-6)


def variants_of(wild_type: str) -> list:
    """Singles (first, last, middle residues), multi-mutants (adjacent sites, sites apart, sites given out of
    order) and one variant given as its mutant sequence."""
    last = len(wild_type) - 1

    def site(i: int, mt: str) -> Site:
        if mt == wild_type[i]:  # any other residue
            mt = tiny.AMINO_ACIDS[(tiny.AMINO_ACIDS.index(mt) + 1) % 20]
        return (i, wild_type[i], mt)

    return [
        [site(0, "W")],
        [site(last, "A")],
        [site(9, "P")],
        [site(4, "G"), site(5, "D")],
        [site(last, "K"), site(2, "C"), site(13, "Y")],
        [site(i, "L") for i in range(0, last + 1, 3)],
        mutant_of(wild_type, [site(1, "M"), site(20, "H")]),
    ]


@pytest.mark.parametrize("family", tiny.PROTEIN_FAMILIES)
def test_variant_scores_equal_the_naive_reference(family, tiny_protein_dir):
    """The four strategies from the engine's tables (one unmasked and one masked table of the wild type, an
    unmasked table of each mutant at its sites, the PLL terms of each sequence) equal the naive reference's
    scores, computed variant by variant."""
    mlm = load(tiny_protein_dir(family))
    naive = NaiveVariants(mlm.model, mlm.tokenizer)
    ids = alphabet_ids(mlm)
    wild_type = WILD_TYPES[1]
    variants = variants_of(wild_type)
    sites = [naive.sites(wild_type, v) for v in variants]
    mutants = [mutant_of(wild_type, s) for s in sites]
    engine = SiteEngine(mlm, SMALL_BUDGET)
    (unmasked,) = engine.unmasked([sentence_of(mlm, wild_type)], ids)
    (masked,) = engine.masked([sentence_of(mlm, wild_type)], ids)
    at_sites = engine.unmasked([sentence_of(mlm, m, [i for i, _, _ in s]) for m, s in zip(mutants, sites)], ids)
    assert engine.passes == 1 + len(wild_type) + len(mutants)
    terms = PLLEngine(mlm, "original", SMALL_BUDGET).token_logprobs(
        [sentence_of(mlm, s) for s in [wild_type, *mutants]]
    )
    pll = [t.sum() for t in terms]
    got = {
        "wt-marginal": [site_score(unmasked, s, [i for i, _, _ in s]) for s in sites],
        "masked-marginal": [site_score(masked, s, [i for i, _, _ in s]) for s in sites],
        "mutant-marginal": [site_score(table, s, list(range(len(s)))) for table, s in zip(at_sites, sites)],
        "pll": [p - pll[0] for p in pll[1:]],
    }
    for strategy in STRATEGIES:
        expected = naive.scores(strategy, wild_type, variants)
        assert np.abs(expected).max() > 0.3, f"{strategy}: scores too small for the comparison to mean anything"
        np.testing.assert_allclose(got[strategy], expected, rtol=0, atol=TOLERANCE, err_msg=f"{family} {strategy}")
    # The strategies differ: a mix-up of tables would not pass as another.
    for a, b in zip(STRATEGIES, STRATEGIES[1:]):
        assert np.abs(np.subtract(got[a], got[b])).max() > 1e-2, (a, b)


@pytest.mark.parametrize("family", tiny.PROTEIN_FAMILIES)
def test_every_single_mutant_costs_one_masked_pass_per_residue(family, tiny_protein_dir):
    """The masked marginal of all 19 x L single mutants of a wild type of L residues: one table of the wild
    type, L masked copies in all (the naive reference runs a copy per variant)."""
    mlm = load(tiny_protein_dir(family))
    wild_type = WILD_TYPES[2]
    singles = [[(i, w, a)] for i, w in enumerate(wild_type) for a in tiny.AMINO_ACIDS if a != w]
    assert len(singles) == 19 * len(wild_type)
    engine = SiteEngine(mlm, SMALL_BUDGET)
    with EncoderCalls(mlm) as calls:
        (table,) = engine.masked([sentence_of(mlm, wild_type)], alphabet_ids(mlm))
    assert engine.passes == calls.passes == len(wild_type)
    got = [site_score(table, s, [s[0][0]]) for s in singles]
    expected = NaiveVariants(mlm.model, mlm.tokenizer).masked_marginal(wild_type, singles)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE, err_msg=family)


@pytest.mark.parametrize("method", ["masked", "unmasked"])
def test_a_sentence_without_targets_gets_an_empty_table_and_no_pass(method, tiny_protein_dir):
    """A sequence with no site to tabulate costs nothing, alone or beside others (unmasked once crashed on a
    batch of such sentences alone: the head had no rows to return); the others' tables are unchanged."""
    mlm = load(tiny_protein_dir("bert"))
    ids = alphabet_ids(mlm)
    empty, full = sentence_of(mlm, WILD_TYPES[0], []), sentence_of(mlm, WILD_TYPES[3])
    engine = SiteEngine(mlm, SMALL_BUDGET)
    (alone,) = getattr(engine, method)([empty], ids)
    assert alone.shape == (0, len(ids)) and engine.passes == engine.batches == 0
    mixed, reports = reported(getattr(engine, method), [empty, full], ids)
    assert engine.passes == (len(full.targets) if method == "masked" else 1)
    assert mixed[0].shape == (0, len(ids)) and reports[-1][0] == reports[-1][1]
    (full_alone,) = getattr(SiteEngine(mlm, SMALL_BUDGET), method)([full], ids)
    np.testing.assert_allclose(mixed[1], full_alone, rtol=0, atol=1e-6)
