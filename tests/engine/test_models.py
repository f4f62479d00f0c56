"""Model loading: heads, weights-only pickles, and clear refusals."""

from __future__ import annotations

import pytest
import torch

from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.model_files import ModelLoadError

from helpers import tiny


def test_folder_without_mlm_head_is_refused(tmp_path):
    from transformers import BertModel

    tokenizer = tiny.make_tokenizer("bert")
    encoder = tiny.make_model("bert", tokenizer).bert  # the bare encoder, no MLM head
    BertModel.save_pretrained(encoder, tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no trained masked-LM head"):
        load_masked_lm(ModelSpec(str(tmp_path)))


def test_missing_folder_and_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_masked_lm(ModelSpec(str(tmp_path / "nope")))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_masked_lm(ModelSpec(str(tmp_path)))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="model.safetensors' is a file; a model is a folder .*pass the folder"):
        load_masked_lm(ModelSpec(str(tmp_path / "model.safetensors")))


def test_causal_lm_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny.make_tokenizer("roberta")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_layer=1, n_embd=16, n_head=2)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot be loaded as a masked LM"):
        load_masked_lm(ModelSpec(str(tmp_path)))


def save_pickled(folder, state=None):
    """A model folder with a pickled `pytorch_model.bin` (transformers 5 itself only writes safetensors)."""
    tokenizer = tiny.make_tokenizer("bert")
    model = tiny.make_model("bert", tokenizer)
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    torch.save(state(model) if state else model.state_dict(), folder / "pytorch_model.bin")
    return model


def test_pickled_checkpoint_loads_through_weights_only(tmp_path):
    model = save_pickled(tmp_path)
    mlm = load_masked_lm(ModelSpec(str(tmp_path)))
    torch.testing.assert_close(mlm.model.state_dict(), model.state_dict())


class Payload:
    """Unpickling this would run code; weights-only loading must refuse it."""

    def __reduce__(self):
        return (print, ("unpickled arbitrary code",))


def test_pickle_with_code_is_refused(tmp_path, capsys):
    save_pickled(tmp_path, lambda model: {**model.state_dict(), "payload": Payload()})
    with pytest.raises(ModelLoadError, match="weights-only"):
        load_masked_lm(ModelSpec(str(tmp_path)))
    assert "unpickled arbitrary code" not in capsys.readouterr().out


def test_cuda_without_a_gpu_is_an_error_not_a_fallback(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        load_masked_lm(ModelSpec(str(tiny_model_dir("bert")), device="cuda"))


def test_code_shipped_with_a_model_folder_never_runs_unless_asked(tmp_path, tiny_model_dir):
    """A folder whose config points transformers at its own Python file: by default that file is never
    imported (trust_remote_code=False is passed explicitly); --trust-remote-code lets it run."""
    import json
    import shutil

    from distributed_scoring.engine.model_files import load_tokenizer

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("bert"), folder)
    marker = tmp_path / "code-ran"
    (folder / "custom.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import BertConfig\n\n\nclass CustomConfig(BertConfig):\n    model_type = 'bert'\n"
    )
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "custom.CustomConfig"}}))
    try:
        load_tokenizer(ModelSpec(str(folder)))
    except ModelLoadError as exc:  # refusing is as good as ignoring the file; running it is not
        assert str(folder) in str(exc)
    assert not marker.exists()
    load_tokenizer(ModelSpec(str(folder), trust_remote_code=True))
    assert marker.exists()


def test_a_model_folder_without_its_tokenizer_is_refused_before_any_work(tmp_path, tiny_model_dir, capsys):
    """transformers 5 builds an empty tokenizer (special tokens only) for such a folder: every row used to
    be scored as unknown tokens with status ok and exit 0."""
    import shutil

    from distributed_scoring.cli import main

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir("bert") / name, folder / name)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(tiny.CORPUS) + "\n")
    rc = main(["score", str(corpus), "--model", str(folder), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # (earlier lines: the fixture saving the tiny model)
    assert rc == 2 and last.startswith("dscore: error:") and "tokenizer files" in last and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_damaged_safetensors_weights_are_one_line_with_the_fix(tmp_path, tiny_model_dir, capsys):
    """A truncated or garbled model.safetensors used to end in a SafetensorError traceback."""
    import shutil

    from distributed_scoring.cli import main

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("bert"), folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick fox\n")
    rc = main(["score", str(corpus), "--model", str(folder), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in err
    assert last.startswith("dscore: error:") and "damaged" in last and "download or convert" in last
