"""The causal engine against the naive log P reference, on every head-table architecture and every way a
tokenizer marks sentence boundaries; loading refuses what is not a causal LM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine import causal
from distributed_scoring.engine.causal import CausalEngine, encode, load_causal_lm, pack
from distributed_scoring.engine.model_files import ModelLoadError
from distributed_scoring.io import schema as S
from distributed_scoring.workloads.causal import CAUSAL_SCHEMA, score_texts

from helpers import rescoring as H
from helpers import tiny
from helpers.reference import NaiveCausal

TEXTS = tiny.CORPUS[:6] + ["the", "Colourless green ideas sleep", "café crème"]
# 24 is below every sentence's length (one sentence per pass), 120 packs a few, 10**6 packs all.
BUDGETS = (24, 120, 10**6)


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    built: dict[str, object] = {}

    def get(family: str):
        if family not in built:
            built[family] = H.save_tiny_causal(family, tmp_path_factory.mktemp(family))
        return built[family]

    return get


def test_families_cover_the_head_table():
    """Every architecture scored through the gathered head is checked against the reference below."""
    archs = {
        H.make_causal_model(arch, H.make_causal_tokenizer(kind)).__class__.__name__
        for kind, arch in H.CAUSAL_FAMILIES.values()
    }
    assert causal._PLAIN_HEADS <= archs
    assert archs - causal._PLAIN_HEADS, "some family should take the full-logits path"


@pytest.mark.parametrize("family", list(H.CAUSAL_FAMILIES))
def test_engine_equals_naive_reference(family, causal_dir):
    lm = load_causal_lm(ModelSpec(str(causal_dir(family))))
    assert (lm.head is not None) == (lm.signature["architecture"] in causal._PLAIN_HEADS)
    naive = NaiveCausal(lm.model, lm.tokenizer)
    expected = [naive.token_logprobs(text) for text in TEXTS]
    assert np.concatenate(expected).std() > 0.5, "conditionals too flat for the comparison to mean anything"
    sequences = encode(lm, TEXTS)
    assert max(len(s) for s in sequences) > BUDGETS[0]
    for budget in BUDGETS:
        engine = CausalEngine(lm, budget)
        got = engine.token_logprobs(sequences)
        table = score_texts(engine, TEXTS)
        for text, g, e, logp, n in zip(TEXTS, got, expected, table[S.LOGP].to_pylist(), table[S.N_TOKENS].to_pylist()):
            assert g.shape == e.shape, text
            np.testing.assert_allclose(g, e, rtol=0, atol=1e-5, err_msg=f"{family} {budget} {text!r}")
            assert logp == pytest.approx(e.sum(), abs=3e-5)
            assert n == len(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "gpt-neox"])
def test_engine_in_float64_equals_reference_to_rounding(family, causal_dir):
    """In float64 the only difference left is rounding: packing, padding and gathering are exact.

    (One family per kind of sentence boundary. GPT-Neo, GPT-J and Gemma-2 are left out: their eager
    attention runs in float32 whatever the weights, so padded batches differ from the reference by ~1e-7.)
    """
    lm = load_causal_lm(ModelSpec(str(causal_dir(family)), dtype="float64"))
    naive = NaiveCausal(lm.model, lm.tokenizer)
    expected = [naive.token_logprobs(text).sum() for text in TEXTS]
    for budget in (BUDGETS[1], BUDGETS[2]):
        logp = score_texts(CausalEngine(lm, budget), TEXTS)[S.LOGP].to_pylist()
        np.testing.assert_allclose(logp, expected, rtol=0, atol=1e-9)


def test_head_chunks_do_not_change_results(causal_dir, monkeypatch):
    """The head takes a few rows at a time when rows x V exceeds HEAD_ELEMENTS (float64: a misplaced
    row would show, blocking differences would not)."""
    import distributed_scoring.engine.masked_lm as models

    lm = load_causal_lm(ModelSpec(str(causal_dir("gpt2")), dtype="float64"))
    sequences = encode(lm, TEXTS)
    whole = CausalEngine(lm, BUDGETS[2]).token_logprobs(sequences)
    monkeypatch.setattr(models, "HEAD_ELEMENTS", 3 * lm.model.config.vocab_size)
    chunked = CausalEngine(lm, BUDGETS[2]).token_logprobs(sequences)
    for w, c in zip(whole, chunked):
        np.testing.assert_allclose(c, w, rtol=0, atol=1e-12)


def test_boundary_tokens_follow_the_tokenizer(causal_dir):
    """GPT-2: <|endoftext|> on both sides; Llama: <s> ... </s> with no second <s> although its tokenizer
    adds one by itself; EOS-only: EOS on both sides; BOS-only: no end token."""
    text = "the quick fox"
    for family, start, end in [
        ("gpt2", H.ENDOFTEXT, H.ENDOFTEXT),
        ("llama", "<s>", "</s>"),
        ("qwen2", H.ENDOFTEXT, H.ENDOFTEXT),
        ("gpt-neox", "<s>", None),
    ]:
        lm = load_causal_lm(ModelSpec(str(causal_dir(family))))
        (ids,) = encode(lm, [text])
        tokens = lm.tokenizer.convert_ids_to_tokens(ids.tolist())
        body = lm.tokenizer.convert_ids_to_tokens(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert tokens == [start, *body, *([end] if end else [])], family
        assert lm.signature["eos"] == end


def test_end_term_is_part_of_log_p(causal_dir):
    """log P(W) = log P(W's tokens | BOS) + log P(EOS | BOS, W): a prefix of a sentence scores differently."""
    lm = load_causal_lm(ModelSpec(str(causal_dir("llama"))))
    engine = CausalEngine(lm)
    (ids,) = encode(lm, ["the quick fox"])
    per_token = engine.token_logprobs([ids])[0]
    logp = score_texts(engine, ["the quick fox"])[S.LOGP][0].as_py()
    assert logp == pytest.approx(per_token.sum())
    assert per_token[-1] < 0 and abs(per_token[:-1].sum() - logp) > 1e-3


def test_blank_and_overlong_texts_become_error_rows(causal_dir):
    lm = load_causal_lm(ModelSpec(str(causal_dir("gpt2"))))
    long = " ".join(tiny.CORPUS)
    table = score_texts(CausalEngine(lm), ["the fox", "  ", long])
    assert table.schema == CAUSAL_SCHEMA
    assert table[S.STATUS].to_pylist() == [S.STATUS_OK, S.STATUS_ERROR, S.STATUS_ERROR]
    assert table[S.LOGP].to_pylist()[1:] == [None, None]
    assert "empty" in table[S.ERROR][1].as_py()
    assert f"maximum of {lm.max_length}" in table[S.ERROR][2].as_py()


def test_pack_covers_every_sequence_once_under_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 40, size=200).tolist()
    for budget in (1, 30, 100, 1000):
        batches = pack(lengths, budget)
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == list(range(len(lengths)))
        for batch in batches:
            width = max(lengths[i] for i in batch)
            assert lengths[batch[0]] == width
            assert len(batch) == 1 or len(batch) * width <= budget
        firsts = [lengths[b[0]] for b in batches]
        assert firsts == sorted(firsts, reverse=True)


def test_soft_capped_logits_are_not_a_plain_head(causal_dir):
    """Why Gemma-2 is not in the head table: its projection alone would give other log-probs."""
    lm = load_causal_lm(ModelSpec(str(causal_dir("gemma2"))))
    exact = score_texts(CausalEngine(lm), TEXTS[:3])[S.LOGP].to_pylist()
    lm.head = lm.model.get_output_embeddings()
    plain = score_texts(CausalEngine(lm), TEXTS[:3])[S.LOGP].to_pylist()
    assert min(abs(a - b) for a, b in zip(exact, plain)) > 1e-2


def test_a_masked_lm_folder_is_refused(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a causal"):
        load_causal_lm(ModelSpec(str(tiny_model_dir("bert"))))


def test_an_encoder_config_without_architectures_is_refused(tmp_path, tiny_model_dir):
    """A BERT config with no `architectures` would load as BertLMHeadModel with bidirectional attention."""
    import json

    folder = tiny_model_dir("bert")
    config = json.loads((folder / "config.json").read_text())
    config.pop("architectures", None)
    target = tmp_path / "bert-no-arch"
    target.mkdir()
    for f in folder.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="bidirectional"):
        load_causal_lm(ModelSpec(str(target)))


def test_missing_folder_and_folder_without_config_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_causal_lm(ModelSpec(str(tmp_path / "nowhere")))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_causal_lm(ModelSpec(str(tmp_path)))


def test_tokenizer_without_bos_or_eos_is_refused():
    tokenizer = H.make_causal_tokenizer("eos_only")
    tokenizer.eos_token = None
    with pytest.raises(ModelLoadError, match="neither a BOS nor an EOS"):
        causal.boundary_ids(tokenizer)


def test_pickled_checkpoint_loads_weights_only(tmp_path, causal_dir):
    """A plain state-dict pickle (no safetensors) loads with weights_only and scores the same."""
    folder = causal_dir("gpt2")
    target = tmp_path / "pickled"
    target.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors":
            (target / f.name).write_bytes(f.read_bytes())
    reference = load_causal_lm(ModelSpec(str(folder)))
    torch.save(reference.model.state_dict(), target / "pytorch_model.bin")
    loaded = load_causal_lm(ModelSpec(str(target)))
    a = score_texts(CausalEngine(reference), TEXTS[:2])[S.LOGP].to_pylist()
    b = score_texts(CausalEngine(loaded), TEXTS[:2])[S.LOGP].to_pylist()
    assert a == pytest.approx(b, abs=1e-6)


def test_progress_is_reported_after_every_forward_pass(causal_dir):
    lm = load_causal_lm(ModelSpec(str(causal_dir("gpt2"))))
    sequences = encode(lm, TEXTS)
    reports: list[tuple[int, int]] = []
    CausalEngine(lm, BUDGETS[0]).token_logprobs(sequences, lambda done, total: reports.append((done, total)))
    total = sum(len(s) for s in sequences)
    assert len(reports) == len(sequences) and reports[-1] == (total, total)  # one sequence per pass
    assert all(a < b for (a, _), (b, _) in zip(reports, reports[1:]))
