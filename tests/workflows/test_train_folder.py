"""The training folder (`io.claim.claim_training`) and the held-out split, without Ray: the same run
continues, another is refused unless --overwrite (which deletes what it wrote, checkpoints included), a
folder of something else is never emptied."""

from __future__ import annotations

import json

import numpy as np
import pytest

from distributed_scoring.config import ModelSpec
from distributed_scoring.errors import UserError
from distributed_scoring.io.claim import claim_training
from distributed_scoring.io.output import OutputError
from distributed_scoring.workflows.train.run import TRAINING_OUTPUTS, TrainOptions, heldout_rows, training_fingerprint


def run_of(lr: float) -> dict:
    data = {"teacher": "t", "teacher_rows": "abc"}
    return training_fingerprint("maskless", ModelSpec("m"), TrainOptions(lr=lr), data)


def test_the_same_run_continues_and_another_is_refused_unless_overwritten(tmp_path):
    out = tmp_path / "out"
    with claim_training(str(out), run_of(1e-4), outputs=TRAINING_OUTPUTS):
        (out / "checkpoints" / "step-00000010").mkdir(parents=True)
    with claim_training(str(out), run_of(1e-4), outputs=TRAINING_OUTPUTS):
        assert (out / "checkpoints" / "step-00000010").exists()  # continued: its checkpoints are kept
    with pytest.raises(OutputError, match=r"different run \(it differs in: lr\)"):
        with claim_training(str(out), run_of(2e-4), outputs=TRAINING_OUTPUTS):
            pass
    with claim_training(str(out), run_of(2e-4), overwrite=True, outputs=TRAINING_OUTPUTS):
        assert not (out / "checkpoints").exists()  # else Ray Train would resume the other run's weights
    assert json.loads((out / "_run.json").read_text())["lr"] == 2e-4
    assert not (out / "_lock.json").exists()


def test_folders_of_something_else_are_never_emptied(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "scores").mkdir()
    (tmp_path / "scores" / "_run.json").write_text(json.dumps({"workload": "pll"}))
    for folder, message in (("mine", "holds no _run.json of a dscore run"), ("scores", "not a training run")):
        for overwrite in (False, True):
            with pytest.raises(OutputError, match=message):
                with claim_training(str(tmp_path / folder), run_of(1e-4), overwrite, outputs=TRAINING_OUTPUTS):
                    pass
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(UserError, match="not an object store"):
        with claim_training("s3://bucket/run", run_of(1e-4), outputs=TRAINING_OUTPUTS):
            pass


def test_the_heldout_split_depends_on_each_id_and_the_seed_only():
    ids = [f"row{i}" for i in range(2000)]
    held = heldout_rows(ids, seed=0, share=0.1)
    assert 150 < held.sum() < 250
    assert (heldout_rows(ids[::-1], 0, 0.1) == held[::-1]).all()  # order does not matter
    assert (heldout_rows(ids[:500], 0, 0.1) == held[:500]).all()  # nor the other rows
    assert not (heldout_rows(ids, 1, 0.1) == held).all()
    assert np.array_equal(heldout_rows(ids, 0, 0.2) | held, heldout_rows(ids, 0, 0.2))  # a larger share adds rows
