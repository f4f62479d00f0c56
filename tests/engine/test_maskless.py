"""The maskless student: predictions against the naive one-sentence reference under any batching, and a
student folder saved and loaded again."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tiny
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.maskless import MasklessEngine, load_student, regressor_for, save_student
from distributed_scoring.engine.model_files import ModelLoadError, STUDENT_FILE, read_student_info
from distributed_scoring.engine.models import load_masked_lm
from distributed_scoring.workloads.prepare import Preparer
from reference import maskless_prediction


@pytest.mark.parametrize("family", ["bert", "roberta", "deberta-v2"])
def test_predictions_equal_the_reference_under_any_budget(family, tiny_model_dir, tmp_path):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir(family))))
    regressor = regressor_for(mlm, mean=-50.0, std=20.0)
    torch.nn.init.normal_(regressor.head.weight, std=0.5)  # a trained head's scale, not the fresh 0.02
    save_student(regressor, mlm, tmp_path, {"teacher": "t"})
    student = load_student(ModelSpec(str(tmp_path)))
    ids = [np.asarray(p.input_ids) for p in Preparer(mlm.tokenizer, mlm.max_length).prepare_texts(tiny.CORPUS)]
    head = regressor.head
    expected = [maskless_prediction(mlm.encoder, head.weight, head.bias, -50.0, 20.0, i.tolist()) for i in ids]
    assert np.std(expected) > 0.5, "predictions too alike for the comparison to mean anything"
    for budget in (20, 100, 10**5):  # 20: below one sentence, each goes alone
        got = MasklessEngine(student, budget).predict(ids)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4, err_msg=f"{family} {budget}")


def test_a_student_folder_is_also_a_masked_lm_folder(tiny_model_dir, tmp_path):
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    save_student(regressor_for(mlm, mean=-1.0, std=2.0), mlm, tmp_path, {"teacher": "scores/"})
    info = read_student_info(str(tmp_path))
    assert info["mean"] == -1.0 and info["std"] == 2.0 and info["teacher"] == "scores/"
    assert load_masked_lm(ModelSpec(str(tmp_path))).head is not None
    assert load_student(ModelSpec(str(tmp_path))).signature["scorer"] == "maskless"


def test_a_folder_without_a_student_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="not a maskless scorer folder"):
        read_student_info(str(tiny_model_dir("bert")))
    with pytest.raises(ModelLoadError, match="does not exist"):
        read_student_info(str(tmp_path / "nowhere"))
    mlm = load_masked_lm(ModelSpec(str(tiny_model_dir("bert"))))
    save_student(regressor_for(mlm, 0.0, 1.0), mlm, tmp_path, {})
    (tmp_path / STUDENT_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(ModelLoadError, match="format 99"):
        load_student(ModelSpec(str(tmp_path)))
