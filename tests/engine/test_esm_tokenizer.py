"""ESM checkpoints ship a Python (slow) tokenizer, `EsmTokenizer`; `load_tokenizer` reads it as a fast one with the
same vocabulary (`model_files.fast_esm_tokenizer`), so ESM-1b and ESM-2 score as the fast-tokenizer models do."""

from __future__ import annotations

import shutil

import pytest
from transformers import EsmTokenizer

from distributed_scoring import MLMScorer
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.model_files import load_tokenizer

from helpers.tiny import ESM_VOCABULARY

TEXTS = ["MKTAYIAK", "M K T A Y", "MKT<mask>AYI", "MKT <mask> AY", "MKJT", "ACDEFGHIKLMNPQRSTVWYXBUZO.-", ""]


@pytest.fixture(scope="module")
def slow_esm(tiny_protein_dir, tmp_path_factory):
    """The tiny ESM model's weights beside an `EsmTokenizer` (vocab.txt), as facebook/esm2_* folders hold them."""
    folder = tmp_path_factory.mktemp("esm-slow")
    source = tiny_protein_dir("esm")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, folder / name)
    (folder / "vocab.txt").write_text("\n".join(ESM_VOCABULARY) + "\n")
    EsmTokenizer(str(folder / "vocab.txt"), model_max_length=96).save_pretrained(folder)
    return folder


def test_the_slow_tokenizer_is_read_as_a_fast_one_with_its_ids(slow_esm):
    slow = EsmTokenizer.from_pretrained(slow_esm)
    fast, max_length = load_tokenizer(ModelSpec(str(slow_esm)))
    assert fast.is_fast and max_length == 96
    for text in TEXTS:
        assert fast(text)["input_ids"] == slow(text)["input_ids"], text
    assert (fast.mask_token_id, fast.pad_token_id, fast.unk_token_id) == (slow.mask_token_id, slow.pad_token_id, 3)
    encoding = fast("MKT<mask>A").encodings[0]
    assert encoding.tokens == ["<cls>", "M", "K", "T", "<mask>", "A", "<eos>"]
    assert encoding.special_tokens_mask == [1, 0, 0, 0, 0, 0, 1]
    assert fast("mkt")["input_ids"] == [0, 3, 3, 3, 2]  # one <unk> per character (EsmTokenizer: one for the run)


def test_an_esm_folder_scores_as_the_fast_tokenizer_folder(slow_esm, tiny_protein_dir):
    wild, mutants = "MKTAYIAKQRQISFVKSHFSRQ", ["K2R", "A4G:Q9E"]
    slow = MLMScorer(slow_esm, device="cpu")
    fast = MLMScorer(tiny_protein_dir("esm"), device="cpu")
    assert slow.pll([wild, "M K T"]) == fast.pll([wild, "M K T"])
    assert slow.variants(mutants, wild) == fast.variants(mutants, wild)
