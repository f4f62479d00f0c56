"""The PLL of texts longer than the model's window (`--long-texts window`) against a naive reference of
its convention, written here: one masked window per token, the model in float64, full logits.

With M the model's maximum length and C = M minus the special tokens of one sequence, content token i of a text
of n > C tokens is scored as log p(x_i | specials + x[s : s + C] with x_i masked), s = min(max(i - C // 2, 0),
n - C). The tiny BERT here takes 32 positions (its tokenizer's limit), so C = 30; texts of C - 1, C, C + 1, 2C and
5C tokens. Texts that fit are scored bit for bit as without windows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from distributed_scoring.api import MLMScorer
from distributed_scoring.engine.masking import Sentence
from distributed_scoring.engine.windows import split, window_start

from helpers import tiny

M = 32
C = M - 2  # [CLS] ... [SEP]


@pytest.fixture(scope="module")
def model32(tmp_path_factory):
    """The tiny BERT whose tokenizer takes at most 32 tokens: a model of 32 positions."""
    folder = tiny.save_tiny("bert", tmp_path_factory.mktemp("bert32"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": M}))
    return folder


@pytest.fixture(scope="module")
def tokenizer(model32):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model32)


@pytest.fixture(scope="module")
def reference_model(model32):
    from transformers import AutoModelForMaskedLM

    return AutoModelForMaskedLM.from_pretrained(model32).double().eval()


def single_token_words(tokenizer) -> list[str]:
    words = sorted({w.strip(".,!?'") for line in tiny.CORPUS for w in line.split()})
    return [w for w in words if w and len(tokenizer(w, add_special_tokens=False)["input_ids"]) == 1]


def text_of(tokenizer, n: int, seed: int = 0) -> str:
    """A text of exactly n content tokens (words of one token each)."""
    words = single_token_words(tokenizer)
    rng = np.random.default_rng(seed)
    text = " ".join(rng.choice(words, n))
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == n
    return text


def multi_piece_text(tokenizer, n_min: int) -> str:
    """A text of at least n_min tokens mixing words of one and of several pieces (for word_l2r)."""
    words = [w for line in tiny.CORPUS for w in line.split()]
    text, i = [], 0
    while len(tokenizer(" ".join(text), add_special_tokens=False)["input_ids"]) < n_min:
        text.append(words[i % len(words)])
        i += 1
    return " ".join(text)


@torch.inference_mode()
def reference(model, tokenizer, text: str, variant: str = "original") -> np.ndarray:
    """Each content token's log-probability in its own window (the convention above), one forward pass each."""
    encoding = tokenizer(text, add_special_tokens=False)
    x = encoding["input_ids"]
    words = encoding.word_ids()
    n = len(x)
    out = []
    for i in range(n):
        if n <= C:
            s, width = 0, n
        else:
            s, width = window_start(i, n, C), C
            if variant == "word_l2r":
                same = [j for j in range(n) if words[j] == words[i]]
                s = min(max(s, same[-1] - C + 1), same[0])
        window = list(x[s : s + width])
        window[i - s] = tokenizer.mask_token_id
        if variant == "word_l2r":
            for j in range(i + 1, s + width):
                if words[j] == words[i]:
                    window[j - s] = tokenizer.mask_token_id
        ids = torch.tensor([[tokenizer.cls_token_id, *window, tokenizer.sep_token_id]])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, 1 + i - s].double(), dim=-1)
        out.append(float(logp[x[i]]))
    return np.array(out)


@pytest.mark.parametrize("n", [C - 1, C, C + 1, 2 * C, 5 * C])
def test_windowed_pll_equals_the_naive_reference(n, model32, tokenizer, reference_model):
    text = text_of(tokenizer, n, seed=n)
    row = MLMScorer(model32, device="cpu").score([text], per_token=True)[0]
    assert row["status"] == "ok" and row["n_tokens"] == n
    assert row["windowed"] == (n > C)
    np.testing.assert_allclose(row["token_logprobs"], reference(reference_model, tokenizer, text), atol=1e-5, rtol=0)
    assert row["pll"] == pytest.approx(sum(row["token_logprobs"]), abs=1e-9)


def test_word_l2r_keeps_each_word_in_one_window_and_equals_its_reference(model32, tokenizer, reference_model):
    text = multi_piece_text(tokenizer, 3 * C)
    row = MLMScorer(model32, device="cpu", variant="word_l2r").score([text], per_token=True)[0]
    assert row["windowed"] and row["status"] == "ok"
    expected = reference(reference_model, tokenizer, text, "word_l2r")
    np.testing.assert_allclose(row["token_logprobs"], expected, atol=1e-5, rtol=0)


def test_texts_that_fit_score_bit_for_bit_as_without_windows(model32, tokenizer):
    texts = [text_of(tokenizer, n, seed=n) for n in (3, C - 1, C)] + tiny.CORPUS[:2]  # 20 and 26 tokens
    windowed = MLMScorer(model32, device="cpu").score(texts, per_token=True)
    plain = MLMScorer(model32, device="cpu", long_texts="error").score(texts, per_token=True)
    assert [r["token_logprobs"] for r in windowed] == [r["token_logprobs"] for r in plain]
    assert [r["pll"] for r in windowed] == [r["pll"] for r in plain] and not any(r["windowed"] for r in windowed)


def test_long_texts_error_keeps_the_error_row(model32, tokenizer):
    row = MLMScorer(model32, device="cpu", long_texts="error").score([text_of(tokenizer, C + 1)])[0]
    assert row["status"] == "error" and "over the model's maximum of 32" in row["error"]


def test_a_long_text_and_short_ones_in_one_batch_score_as_each_alone(model32, tokenizer):
    scorer = MLMScorer(model32, device="cpu", batch_tokens=256)
    texts = [text_of(tokenizer, 2 * C + 7, seed=1), *tiny.CORPUS[:3], text_of(tokenizer, 3 * C, seed=2)]
    together = scorer.score(texts, per_token=True)
    alone = [scorer.score([t], per_token=True)[0] for t in texts]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a["token_logprobs"], b["token_logprobs"], atol=1e-5, rtol=0)


def test_every_token_is_a_target_of_exactly_one_window_of_the_full_width():
    n = 5 * C + 3
    ids, words = np.array([101, *range(1000, 1000 + n), 102]), np.array([-1, *range(n), -1])
    sentence = Sentence(ids, np.arange(1, n + 1), words)
    windows = split(sentence, M, "original")
    assert all(len(w.sentence.input_ids) == M for w in windows)
    slots = np.concatenate([w.slots for w in windows])
    assert sorted(slots.tolist()) == list(range(n)) and len(windows) == n - C + 1
    for w in windows:  # each window's targets are the tokens it was chosen for, at their places
        np.testing.assert_array_equal(w.sentence.input_ids[w.sentence.targets], 1000 + w.slots)


def test_a_word_longer_than_the_window_cannot_keep_word_l2r_in_one_window():
    n = 2 * C
    words = np.array([-1, *([0] * (C + 1)), *range(1, n - C), -1])
    sentence = Sentence(np.array([101, *range(1000, 1000 + n), 102]), np.arange(1, n + 1), words)
    assert "longer than the model's window" in split(sentence, M, "word_l2r")
    assert isinstance(split(sentence, M, "original"), list)
