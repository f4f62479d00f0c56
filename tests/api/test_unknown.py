"""Text the model cannot read: every call that scores it says so once (a Python warning, by the rule of
`dscore score`'s summary), and the rows count each text's unknown tokens. The tiny model's vocabulary has no
Greek or Chinese; the offline antibody model has no English (README's case)."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pytest
from datasets import Dataset

from distributed_scoring import MLMScorer, PLLStage
from distributed_scoring.io import schema as S

from helpers.pll import TEXTS

UNREADABLE = ["ζζζ ψψψ ωωω", "猫 坐 在", "the ζζζ fox"]  # all, all, and one of three tokens [UNK]
MOSTLY_UNKNOWN = "mostly unknown tokens"


@pytest.fixture(scope="module")
def bert(tiny_model_dir):
    return tiny_model_dir("bert")


@pytest.fixture(scope="module")
def scorer(bert):
    return MLMScorer(bert, device="cpu")


def one_warning(call) -> warnings.WarningMessage:
    """The one unknown-tokens warning the call gives."""
    with pytest.warns(UserWarning, match=MOSTLY_UNKNOWN) as record:
        call()
    unknown = [w for w in record if MOSTLY_UNKNOWN in str(w.message)]
    assert len(unknown) == 1 and unknown[0].category.__name__ == "UnknownTokensWarning"
    return unknown[0]


@pytest.mark.parametrize("method", ["pll", "score", "token_score", "word_score", "pppl", "chain"])
def test_each_call_on_unreadable_text_warns_once_in_python_names(scorer, method):
    warning = one_warning(lambda: getattr(scorer, method)(UNREADABLE + TEXTS[:2]))
    assert warning.filename == __file__  # it points at the caller's line, not into the library
    message = str(warning.message)
    assert message.startswith("2 of 5 scored rows (40%) are mostly unknown tokens")
    assert "split_chars" in message and "--" not in message  # the API's keyword, not the CLI's flag


def test_rows_count_the_unknown_tokens(scorer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = scorer.score(UNREADABLE + [""], per_token=True)
        chained = scorer.chain(UNREADABLE + [""])
    assert [r[S.N_UNKNOWN] for r in rows] == [3, 3, 1, 0]
    assert [r["tokens"].count(scorer.mlm.tokenizer.unk_token) for r in rows[:3]] == [3, 3, 1]
    assert [r[S.N_UNKNOWN] for r in chained] == [3, 3, 1, 0]


def test_readable_text_and_a_few_unreadable_texts_give_no_warning(scorer):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        scorer.pll(TEXTS)
        scorer.pll(UNREADABLE[:1] + TEXTS[:9])  # 1 of 10 mostly unknown: the summary's 10% is not passed
        scorer.pll(["", None])  # nothing scored


def test_batches_of_pll_stage_and_datasets_warn_once_each(bert, scorer):
    stage = PLLStage(str(bert), device="cpu")
    one_warning(lambda: stage(pa.table({"text": UNREADABLE})))
    dataset = Dataset.from_dict({"text": UNREADABLE * 2})
    with pytest.warns(UserWarning, match=MOSTLY_UNKNOWN) as record:
        scorer.score_dataset(dataset, batch_size=3)
    assert sum(MOSTLY_UNKNOWN in str(w.message) for w in record) == 2  # one per batch


def test_a_model_folder_may_be_a_path(bert):
    assert MLMScorer(bert, device="cpu").signature["model"] == str(bert)


def test_english_into_the_offline_antibody_model_warns_and_counts(offline_model_dir):
    scorer = MLMScorer(offline_model_dir("sapiens-vh"), device="cpu", split_chars=True)
    english = ["The cat sat on the mat.", "Colourless green ideas sleep furiously."]
    message = str(one_warning(lambda: scorer.pll(english)).message)
    assert message.startswith("2 of 2 scored rows (100%)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = scorer.score(english)
    assert all(r[S.N_UNKNOWN] > r[S.N_TOKENS] / 2 for r in rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        heavy_chain = scorer.pll(["EVQLLESGGGLVQPGGSLRLSCAASGFTFS", "SFTFGSAACSLRLSGGPQVLGGGSELLQVE"])
    assert heavy_chain[0] > heavy_chain[1] + 50  # README's example: the chain far above its reverse
