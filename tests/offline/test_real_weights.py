"""Real pretrained weights (from PyPI packages): the engine equals the naive reference, and real
sequences score far above shuffled ones.

AntiBERTy is BERT, Sapiens VH is fairseq RoBERTa converted to transformers, rxnmapper is ALBERT. Short
sequences keep the float64 reference fast on two CPU cores.

Two checks per model. Logic: the engine run in float64 equals the float64 reference to rounding, so
packing, gathering and masking are exact. Precision: the engine in float32 is within 1e-5 of the float64
reference, or, where the model's own float32 rounding already exceeds that (Sapiens VH: its head
amplifies float32 noise in the hidden states), no further off than the naive one-copy-per-pass method
in float32 on the same tokens.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.pll import PLLEngine
from distributed_scoring.offline.antibodies import shuffled, spaced, v_genes
from distributed_scoring.workloads.prepare import PLLPreparer

from helpers.reference import NaiveScorer

TRASTUZUMAB_VH = "EVQLVESGGGLVQPGGSLRLSCAASGFNIKDTYIHWVRQAPGKGLEWVARIYPTNGYTRYADSVKGRFTISADTSKNTAYLQMNSLRAEDTAVYYCSRWGGDGFYAMDYWGQGTLVTVSS"  # noqa: E501
REACTIONS = [
    "CC(C)S.CN(C)C=O.Fc1cccnc1F.O=C([O-])[O-].[K+].[K+]>>CC(C)Sc1ncccc1F",
    "CCOC(=O)c1ccc(N)cc1.O=C(Cl)c1ccccc1>>CCOC(=O)c1ccc(NC(=O)c2ccccc2)cc1",
    "OB(O)c1ccccc1.Brc1ccc(C#N)cc1>>N#Cc1ccc(-c2ccccc2)cc1",
]


def engine_scores(mlm, texts, budget=2048):
    prepared = PLLPreparer(mlm.tokenizer, mlm.max_length).prepare_texts(texts)
    assert all(p.error is None for p in prepared), [p.error for p in prepared]
    sentences = [Sentence(np.array(p.input_ids), np.array(p.targets), np.array(p.piece_words)) for p in prepared]
    return PLLEngine(mlm, "original", budget).token_logprobs(sentences)


def assert_exact(path: str, texts: list[str], budget: int) -> None:
    mlm = load_masked_lm(ModelSpec(path))
    expected = [NaiveScorer(mlm.model, mlm.tokenizer).token_logprobs(t) for t in texts]
    mlm64 = load_masked_lm(ModelSpec(path, dtype="float64"))
    for got, e in zip(engine_scores(mlm64, texts, budget), expected):
        np.testing.assert_allclose(got, e, rtol=0, atol=1e-9)
    naive32 = NaiveScorer(mlm.model, mlm.tokenizer, dtype=torch.float32)
    floor = max(np.abs(naive32.token_logprobs(t) - e).max() for t, e in zip(texts, expected))
    error = max(np.abs(got - e).max() for got, e in zip(engine_scores(mlm, texts, budget), expected))
    assert error <= max(1e-5, 2 * floor), (error, floor)


def human_heavy(n: int, length: int) -> list[str]:
    genes = sorted(v_genes("human").values())
    return [g[:length] for g in random.Random(1).sample(genes, n)]


@pytest.mark.parametrize("name", ["antiberty", "sapiens-vh"])
def test_antibody_models_equal_reference_and_separate_real_from_shuffled(name, offline_model_dir):
    assert_exact(str(offline_model_dir(name)), [spaced(s) for s in human_heavy(3, 24)], budget=100)
    mlm = load_masked_lm(ModelSpec(str(offline_model_dir(name))))

    rng = random.Random(2)
    real = human_heavy(4, 60)
    fake = [shuffled(s, rng) for s in real]
    per_token = [s.mean() for s in engine_scores(mlm, [spaced(s) for s in real + fake])]
    real_mean, fake_mean = np.mean(per_token[:4]), np.mean(per_token[4:])
    assert min(per_token[:4]) > max(per_token[4:]), per_token
    assert real_mean - fake_mean > 1.0


@pytest.mark.parametrize("name, expected", [("antiberty", -0.645), ("sapiens-vh", -1.01)])
def test_trastuzumab_matches_published_reference_points(name, expected, offline_model_dir):
    """../shared/MODELS.md reports these PLL-per-residue values for trastuzumab VH."""
    mlm = load_masked_lm(ModelSpec(str(offline_model_dir(name))))
    (scores,) = engine_scores(mlm, [spaced(TRASTUZUMAB_VH)])
    assert len(scores) == len(TRASTUZUMAB_VH)
    assert scores.mean() == pytest.approx(expected, abs=0.005)


def test_rxnmapper_albert_equals_reference_and_separates_real_from_shuffled(offline_model_dir):
    assert_exact(str(offline_model_dir("rxnmapper")), REACTIONS, budget=300)
    mlm = load_masked_lm(ModelSpec(str(offline_model_dir("rxnmapper"))))
    rng = random.Random(3)
    fake = [shuffled(r, rng) for r in REACTIONS]
    per_token = [s.mean() for s in engine_scores(mlm, REACTIONS + fake)]
    assert min(per_token[:3]) > max(per_token[3:]) + 1.0, per_token
