"""Infilling with real weights: AntiBERTy (from PyPI, cached) fills masked residues of germline chains."""

from __future__ import annotations

import numpy as np

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.infill import InfillEngine, InfillExample, InfillSettings
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.offline.antibodies import spaced, v_genes
from distributed_scoring.workloads.infill import allowed_tokens

from helpers.reference import NaiveInfill

AMINO_ACIDS = tuple("ACDEFGHIKLMNPQRSTVWY")


def masked(mlm, chain: str, start: int, k: int) -> tuple[InfillExample, list[int]]:
    ids = np.array(mlm.tokenizer(spaced(chain))["input_ids"], dtype=np.int64)
    masks = np.arange(start, start + k) + 1  # after [CLS]
    truth = ids[masks].tolist()
    ids[masks] = mlm.mask_token_id
    return InfillExample(ids, masks), truth


def test_antiberty_refills_germline_residues_and_a_full_beam_is_exact(offline_model_dir):
    mlm = load_masked_lm(ModelSpec(str(offline_model_dir("antiberty"))))
    allowed = allowed_tokens(mlm.tokenizer, mlm.model.config.vocab_size, AMINO_ACIDS)
    engine = InfillEngine(mlm, allowed)
    chains = [c[:60] for _, c in sorted(v_genes("human").items())[:6]]
    examples, truths = zip(*(masked(mlm, c, 20 + 3 * i, 3) for i, c in enumerate(chains)))
    for decoder in ("standard", "hcb"):
        fills = engine.search(list(examples), InfillSettings(decoder, "best-to-worst", beam=5))
        top5 = sum(any(f.tokens.tolist() == t for f in fs) for fs, t in zip(fills, truths))
        assert top5 >= 4, f"{decoder}: the germline residues are in the top 5 of only {top5} of 6 chains"
    # two masked residues, all 400 fills: the search equals brute force on real weights (float32 engine)
    example, _ = masked(mlm, chains[0], 30, 2)
    ids = [int(i) for i in np.flatnonzero(allowed)]
    want = sorted(
        NaiveInfill(mlm.model, mlm.mask_token_id).fills(example.input_ids.tolist(), example.masks.tolist(), ids, "l2r"),
        key=lambda f: f[1],
        reverse=True,
    )
    got = engine.search([example], InfillSettings("standard", "l2r", beam=400))[0]
    assert [tuple(f.tokens.tolist()) for f in got[:20]] == [w[0] for w in want[:20]]
    np.testing.assert_allclose([f.chain for f in got], [w[1] for w in want], atol=1e-5)
