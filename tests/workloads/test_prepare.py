"""Tokenisation into engine inputs: what is scored, word counts, and rows that cannot be scored."""

from __future__ import annotations

import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.model_files import load_tokenizer
from distributed_scoring.workloads.prepare import PROBE_CHARS_PER_TOKEN, PLLPreparer, prepare_encoding


@pytest.fixture(scope="module")
def preparers(tiny_model_dir):
    def get(family: str) -> PLLPreparer:
        tokenizer, max_length = load_tokenizer(ModelSpec(str(tiny_model_dir(family))))
        return PLLPreparer(tokenizer, max_length)

    return get


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "modernbert"])
def test_specials_are_never_targets_and_words_are_whitespace_words(family, preparers):
    prep = preparers(family)
    text = "Naïve  café owners\tserve crème brûlée."
    (p,) = prep.prepare_texts([text])
    assert p.error is None
    specials = set(prep.tokenizer.all_special_ids) - {prep.tokenizer.unk_token_id}
    assert all(p.input_ids[t] not in specials for t in p.targets)
    assert sum(p.input_ids[i] in specials for i in range(len(p.input_ids))) == len(p.input_ids) - len(p.targets)
    assert p.n_words == 6
    # Every word gets at least one piece and pieces are assigned in order.
    assert sorted(set(p.target_words)) == list(range(6))
    assert p.target_words == sorted(p.target_words)


@pytest.mark.parametrize("text", ["", "   ", "\t \u3000"])
def test_blank_text_is_an_error_row(text, preparers):
    (p,) = preparers("bert").prepare_texts([text])
    assert p.error == "empty or whitespace-only text"


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_over_long_text_is_an_error_not_truncated(family, preparers):
    prep = preparers(family)
    n_specials = len(prep.tokenizer("the")["input_ids"]) - 1
    fits = " ".join(["the"] * (prep.max_length - n_specials))
    too_long = fits + " the"
    ok, long = prep.prepare_texts([fits, too_long])
    assert ok.error is None and len(ok.input_ids) == prep.max_length
    assert long.error is not None and "not truncated" in long.error
    assert f"maximum of {prep.max_length}" in long.error


def test_an_over_long_error_row_names_long_texts_window_only_where_the_workload_windows(preparers):
    """`--long-texts error` (the PLL's, asked for) names the way out; chain and joints, which cannot window,
    do not; a megabyte line refused on its prefix says the same."""
    prep = preparers("bert")
    too_long = " ".join(["the"] * prep.max_length)
    huge = "the cat sat on the mat. " * 100_000
    chosen = PLLPreparer(prep.tokenizer, prep.max_length, long_texts="error").prepare_texts([too_long, huge])
    for row in chosen:
        assert "score it in windows of the model's width with --long-texts window" in row.error, row.error
    assert all("--long-texts" not in row.error for row in prep.prepare_texts([too_long, huge]))


def test_roberta_positions_leave_room_for_the_padding_offset(preparers):
    from helpers.tiny import MAX_POSITIONS

    assert preparers("roberta").max_length == MAX_POSITIONS - 2
    assert preparers("bert").max_length == MAX_POSITIONS


def test_one_token_sentence_and_duplicates(preparers):
    one, dup1, dup2 = preparers("bert").prepare_texts(["the", "Hi there", "Hi there"])
    assert one.error is None and len(one.targets) == 1 and one.n_words == 1
    assert dup1 == dup2


class SpyTokenizer:
    """The tokenizer, noting the longest text it was asked to tokenise."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.unk_token_id = tokenizer.unk_token_id
        self.longest = 0

    def __call__(self, texts, **kwargs):
        self.longest = max([self.longest, *map(len, texts)])
        return self.tokenizer(texts, **kwargs)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "modernbert"])
def test_a_megabyte_line_is_refused_on_a_bounded_prefix_without_tokenising_it(family, preparers):
    prep = preparers(family)
    spy = PLLPreparer(SpyTokenizer(prep.tokenizer), prep.max_length)
    huge = "the cat sat on the mat. " * 100_000  # 2.4 MB
    ok, long = spy.prepare_texts(["the cat", huge])
    assert ok.error is None
    assert "not truncated" in long.error and f"maximum of {prep.max_length}" in long.error
    assert f"{len(huge)} characters long" in long.error
    assert spy.tokenizer.longest <= prep.max_length * PROBE_CHARS_PER_TOKEN


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "modernbert"])
def test_the_prefix_check_never_refuses_a_text_that_fits(family, preparers):
    """Texts past the probe length: the probe's verdict must match tokenising the whole text."""
    prep = preparers(family)
    limit = prep.max_length * PROBE_CHARS_PER_TOKEN
    fits = " ".join(["the"] * (prep.max_length // 2))
    texts = [
        fits + " " * limit + "end",  # mostly whitespace: fits where spaces are no tokens (WordPiece)
        "x" * (limit + 10),  # one giant word: no word boundary to cut at
        "supercalifragilistic " * (limit // 10),  # many tokens per word
        "ab" * (limit // 2) + " tail",  # the probe is a single word
        " " + "the " * (limit // 4),  # cut exactly at a word boundary
    ]
    probed = prep.prepare_texts(texts)
    encodings = prep.tokenizer(texts, return_special_tokens_mask=True, return_offsets_mapping=True).encodings
    whole = [prepare_encoding(e, t, prep.max_length) for e, t in zip(encodings, texts)]
    assert [p.error is None for p in probed] == [w.error is None for w in whole]
