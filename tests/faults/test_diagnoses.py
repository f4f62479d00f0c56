"""What a refusal says is true, and it is one line that says what to do.

A binary file was diagnosed as "CR-only line endings"; a UTF-16 file with its byte-order mark got "not
valid UTF-8" on line 1 and had its line 2 (`\\x00T\\x00h...`) scored as ok; a model that needs its own
Python code was refused in three lines pointing at hf.co and at a Python argument, not at the
`--trust-remote-code` flag. (tests/io/test_bad_inputs.py checks the two files' refusals at planning.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distributed_scoring.cli import main

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"


def refusal(capsys, args: list[str]) -> str:
    capsys.readouterr()  # (the fixture's progress bars when it builds the model)
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "name, words, wrong",
    [
        ("binary.dat", "binary.dat is not a text file", "CR-only"),
        ("utf16_bom.txt", "utf16_bom.txt is UTF-16 text", "not valid UTF-8"),
    ],
)
def test_a_file_that_is_not_utf8_text_is_named_for_what_it_is(tmp_path, tiny_model_dir, capsys, name, words, wrong):
    out = tmp_path / "out"
    err = refusal(capsys, ["score", str(BAD / name), "--model", str(tiny_model_dir("bert")), "--output", str(out)])
    assert words in err and wrong not in err
    assert not out.exists()  # nothing scored


def remote_code_model(tmp_path: Path, tiny_model_dir) -> Path:
    """A model folder whose config names a model type of its own, defined in a Python file beside it."""
    folder = tmp_path / "custom-model"
    shutil.copytree(tiny_model_dir("bert"), folder)
    (folder / "custom.py").write_text(
        "from transformers import BertConfig\n\n\nclass CustomConfig(BertConfig):\n    model_type = 'custom-bert'\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="custom-bert", auto_map={"AutoConfig": "custom.CustomConfig"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("command", ["score", "rescore-causal"])
def test_a_model_that_needs_its_own_code_names_the_flag_in_one_line(tmp_path, tiny_model_dir, capsys, command):
    model = remote_code_model(tmp_path, tiny_model_dir)
    corpus = tmp_path / "in.txt"
    corpus.write_text("the quick brown fox\n")
    if command == "score":
        args = ["score", str(corpus), "--model", str(model), "--output", str(tmp_path / "out")]
    else:
        nbest = tmp_path / "n.jsonl"
        nbest.write_text(json.dumps({"utt_id": "u", "hyp_id": 1, "text": "a b", "score": -1.0, "ref": "a b"}) + "\n")
        args = [
            "rescore",
            "--dev",
            str(nbest),
            "--test",
            str(nbest),
            "--model",
            str(tiny_model_dir("bert")),
            "--causal-model",
            str(model),
            "--output",
            str(tmp_path / "out"),
        ]
    err = refusal(capsys, args)
    assert "needs Python code shipped with it" in err and "pass --trust-remote-code" in err
    assert "hf.co" not in err and "trust_remote_code=True" not in err
