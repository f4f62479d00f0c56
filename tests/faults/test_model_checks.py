"""Models that cannot be masked LMs are refused before the output folder is claimed, on every path, and a run
refused by a check that only the model's loader can make leaves the folder as it found it.

Before: a bare BertModel, a T5 and a truncated model.safetensors were each a clear exit 2 in-process, but
after `_run.json`, rows/ and _done/ were written, so the corrected command was refused as "a different run";
with `--ray` they ended in 100-150 lines and exit 1, "incomplete: Ray lost a worker ... rerun".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_scoring.cli import main

from helpers import rescoring as H
from helpers import tiny
from helpers.cli import refusal
from helpers.driver import embedded_env

DSCORE = str(Path(sys.executable).with_name("dscore"))


def _with_tokenizer(model_folder: Path, base: Path) -> Path:
    for f in base.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, model_folder / f.name)
    return model_folder


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A good tiny BERT and the bad ones made from it."""
    from transformers import BertModel, T5Config, T5ForConditionalGeneration

    root = tmp_path_factory.mktemp("models")
    good = tiny.save_tiny("bert", root / "good")
    BertModel.from_pretrained(good).save_pretrained(root / "headless")
    headless = _with_tokenizer(root / "headless", good)
    unlabelled = shutil.copytree(headless, root / "headless-unlabelled")  # no `architectures`: only loading tells
    config = json.loads((unlabelled / "config.json").read_text())
    del config["architectures"]
    (unlabelled / "config.json").write_text(json.dumps(config))
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=220, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8))
    t5.save_pretrained(root / "t5")
    _with_tokenizer(root / "t5", good)
    truncated = shutil.copytree(good, root / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {
        "good": good,
        "headless": headless,
        "unlabelled": unlabelled,
        "t5": root / "t5",
        "truncated": truncated,
    }


@pytest.fixture
def corpus(tmp_path) -> str:
    path = tmp_path / "in.txt"
    path.write_text("the cat sat\non the mat\n")
    return str(path)


SAYS = {
    "headless": "has no trained masked-LM head: it was saved as BertModel",
    "unlabelled": "has no trained masked-LM head: 6 weights are missing",
    "t5": "its model type 't5' has no masked-LM class",
    "truncated": "safetensors weights of .* are damaged \\(model.safetensors: \\d+ bytes where its header describes",
}


@pytest.mark.parametrize("bad", list(SAYS))
def test_a_bad_model_leaves_no_folder_and_the_corrected_command_runs(bad, models, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    line = refusal(capsys, ["score", corpus, "--model", str(models[bad]), "--output", str(out)])
    assert re.search(SAYS[bad], line), line
    assert not out.exists()  # before: _run.json, rows/ and _done/ were written
    assert main(["score", corpus, "--model", str(models["good"]), "--output", str(out)]) == 0


def test_an_existing_empty_folder_stays_empty(models, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    refusal(capsys, ["score", corpus, "--model", str(models["unlabelled"]), "--output", str(out)])
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("bad", ["t5", "unlabelled"])
def test_audit_and_rescore_leave_no_folder(bad, models, corpus, tmp_path, capsys):
    refusal(capsys, ["audit", corpus, "--model", str(models[bad]), "--output", str(tmp_path / "audit")])
    records, _ = H.synthetic_nbest(3, 3, seed=1)
    nbest = tmp_path / "nbest.jsonl"
    nbest.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["rescore", "--dev", str(nbest), "--test", str(nbest), "--model", str(models[bad])]
    refusal(capsys, [*args, "--output", str(tmp_path / "rescore")])
    assert not (tmp_path / "audit").exists() and not (tmp_path / "rescore").exists()


@pytest.mark.ray
@pytest.mark.parametrize("bad", ["t5", "unlabelled"])
def test_on_ray_a_bad_model_is_one_line_exit_2_and_leaves_no_folder(bad, models, corpus, tmp_path):
    """`unlabelled` is found only by the scoring actor's loader: its creation error is carried to the driver as
    exit 2 with its cause, not "incomplete: Ray lost a worker ... rerun"."""
    out = tmp_path / "out"
    argv = [DSCORE, "score", corpus, "--model", str(models[bad]), "--output", str(out), "--ray"]
    done = subprocess.run(argv, capture_output=True, text=True, env=embedded_env(), timeout=300)
    lines = [line for line in done.stderr.splitlines() if line.startswith("dscore: ")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "no trained masked-LM head" in lines[0] or "no masked-LM class" in lines[0]
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 8, done.stderr[-3000:]
    assert not out.exists()
