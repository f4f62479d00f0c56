"""`--model x.pt`: a fair-esm checkpoint converted to a transformers folder scores as fair-esm's own model does.

Tiny random ESM-2 and ESM-1v models are built with fair-esm and saved as its hub files are laid out (weights
under fairseq's prefixes, ESM-2's settings in `cfg`, ESM-1b/1v's in `args`, ESM-2's contact regression beside
it), so that `esm.pretrained.load_model_and_alphabet_local` loads them: that model is the reference. dscore's
PLL and masked marginals, through the CLI with --model the .pt file, equal its forward within 1e-5.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
from contextlib import redirect_stdout
from pathlib import Path

import esm  # fair-esm, a test dependency: its absence fails here rather than skipping the round trip
import pyarrow.parquet as pq
import pytest
import torch

from distributed_scoring.cli import main
from distributed_scoring.engine.esm_checkpoint import ALPHABET
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.offline.fair_esm import model_folder

WILD = "MKTAYIAKQRQISFVKSHFSRQ"
SEQUENCES = [WILD, "MKTLLV", "ACDEFGHIKLMNPQRSTVWY"]
MUTANTS = ["K2R", "A4G", "Q9E:S13T", "M1L:K8A:Q22W"]
TOLERANCE = 1e-5


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight drawn at random (fair-esm starts layer norms at 1 and biases at 0, which would hide a
    weight mapped to the wrong place); rotary tables are buffers and stay."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.25)
    return model.eval()


def hub_layout(state: dict) -> dict:
    """Weights under the fairseq module names fair-esm's hub files use (its loader strips them)."""
    return {
        (f"encoder.{k}" if k.startswith("lm_head") else f"encoder.sentence_encoder.{k}"): v for k, v in state.items()
    }


def save_esm2(path: Path, seed: int = 0) -> Path:
    """A tiny ESM-2 as esm2_t*_UR50D.pt holds it, with its contact regression in the file beside it."""
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = randomised(
        esm.model.esm2.ESM2(num_layers=2, embed_dim=32, attention_heads=4, alphabet=alphabet, token_dropout=True), seed
    )
    state = model.state_dict()
    contact = {k: state.pop(k) for k in list(state) if k.startswith("contact_head.")}
    cfg = argparse.Namespace(encoder_layers=2, encoder_embed_dim=32, encoder_attention_heads=4, token_dropout=True)
    torch.save({"model": hub_layout(state), "cfg": {"model": cfg}}, path)
    torch.save({"model": contact}, path.with_name(f"{path.stem}-contact-regression.pt"))
    return path


def save_esm1v(path: Path, seed: int = 0) -> Path:
    """A tiny ESM-1v (ESM-1b's architecture: learned positions, a layer norm before the encoder) as
    esm1v_t33_650M_UR90S_*.pt holds it: fairseq's encoder_ settings in `args`, no contact regression."""
    alphabet = esm.data.Alphabet.from_architecture("roberta_large")
    settings = {"layers": 2, "embed_dim": 32, "ffn_embed_dim": 64, "attention_heads": 4}
    args = argparse.Namespace(arch="roberta_large", max_positions=64, token_dropout=True, emb_layer_norm_before=True)
    model = randomised(esm.model.esm1.ProteinBertModel(argparse.Namespace(**vars(args), **settings), alphabet), seed)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("contact_head.")}
    saved = argparse.Namespace(**vars(args), **{f"encoder_{k}": v for k, v in settings.items()})
    torch.save({"model": hub_layout(state), "args": saved}, path)
    return path


def fair_esm_model(path: Path) -> tuple[torch.nn.Module, object]:
    """The model fair-esm's own loader makes of the file (which, under torch's weights-only default, needs the
    settings' Namespace allowed)."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        model, alphabet = esm.pretrained.load_model_and_alphabet_local(str(path))
    return model.eval(), alphabet


def log_probs(model: torch.nn.Module, alphabet, sequence: str, masked: list[int]) -> torch.Tensor:
    """fair-esm's log-probabilities at every position of `sequence` with residues `masked` (0-based) masked:
    (T + 2, V), <cls> first."""
    _, _, tokens = alphabet.get_batch_converter()([("s", sequence)])  # (1, T + 2)
    tokens[0, [i + 1 for i in masked]] = alphabet.mask_idx
    with torch.inference_mode():
        return torch.log_softmax(model(tokens)["logits"][0].double(), dim=-1)


def reference_pll(model, alphabet, sequence: str) -> float:
    """Sum over residues of log p(residue | the rest, it masked): one masked copy per forward."""
    return sum(
        log_probs(model, alphabet, sequence, [i])[i + 1, alphabet.get_idx(a)].item() for i, a in enumerate(sequence)
    )


def reference_masked_marginal(model, alphabet, mutant: str) -> float:
    """Sum over mutated positions of log p(mt) - log p(wt), the wild type with that position alone masked
    (ESM-1v's masked marginal, as ESM's predict.py computes it)."""
    total = 0.0
    for site in mutant.split(":"):
        i, wt, mt = int(site[1:-1]) - 1, site[0], site[-1]
        lp = log_probs(model, alphabet, WILD, [i])
        total += (lp[i + 1, alphabet.get_idx(mt)] - lp[i + 1, alphabet.get_idx(wt)]).item()
    return total


def run(*args: str) -> dict:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert main(list(args)) == 0
    return json.loads(buffer.getvalue())


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("DSCORE_CACHE", str(folder))
    return folder


@pytest.mark.parametrize("save", [save_esm2, save_esm1v], ids=["esm2", "esm1v"])
def test_pll_and_masked_marginals_equal_fair_esm(tmp_path, cache, save, caplog):
    checkpoint = save(tmp_path / f"{save.__name__.removeprefix('save_')}_t2_tiny.pt")
    model, alphabet = fair_esm_model(checkpoint)
    assert alphabet.all_toks == list(ALPHABET)  # the converted tokenizer's ids are fair-esm's, token for token
    corpus = tmp_path / "proteins.txt"
    corpus.write_text("\n".join(SEQUENCES) + "\n")
    with caplog.at_level(logging.INFO):
        run("score", str(corpus), "--model", str(checkpoint), "--output", str(tmp_path / "pll"))
    assert "converting fair-esm checkpoint" in caplog.text
    plls = {r[S.TEXT]: r[S.PLL] for r in pq.read_table(tmp_path / "pll" / "rows").to_pylist()}
    pll_error = max(abs(plls[s] - reference_pll(model, alphabet, s)) for s in SEQUENCES)

    table = tmp_path / "assay.csv"
    with table.open("w", newline="") as f:
        csv.writer(f).writerows([["mutant", "DMS_score"], *([m, k] for k, m in enumerate(MUTANTS))])
    run(
        "variants", str(table), "--model", str(checkpoint), "--target-seq", WILD, "--strategy", "masked-marginal",
        "--output", str(tmp_path / "variants"),
    )  # fmt: skip
    scores = {r["mutant"]: r["score"] for r in pq.read_table(tmp_path / "variants" / "variants.parquet").to_pylist()}
    marginal_error = max(abs(scores[m] - reference_masked_marginal(model, alphabet, m)) for m in MUTANTS)
    print(f"{checkpoint.name}: max |PLL - fair-esm| {pll_error:.2e}, masked marginal {marginal_error:.2e}")
    assert pll_error <= TOLERANCE and marginal_error <= TOLERANCE


def test_converted_once_per_file_contents(tmp_path, cache):
    first = save_esm2(tmp_path / "esm2_a.pt", seed=0)
    folder = Path(model_folder(str(first)))
    assert folder.parent == cache / "fair-esm" and (folder / "config.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert model_folder(str(first)) == str(folder)  # found complete: not converted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    copy = tmp_path / "elsewhere" / "esm2_a.pt"
    copy.parent.mkdir()
    copy.write_bytes(first.read_bytes())
    assert model_folder(str(copy)) == str(folder)  # the same bytes under another path: the same folder
    other = model_folder(str(save_esm2(tmp_path / "esm2_b.pt", seed=1)))
    assert other != str(folder) and Path(other).parent == folder.parent
    assert model_folder(str(tmp_path / "a_folder")) == str(tmp_path / "a_folder")  # not a .pt file: as it is


def test_what_is_not_an_esm_checkpoint_is_refused_in_one_line(tmp_path, cache, capsys):
    tensors = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, tensors)
    with pytest.raises(UserError, match="not a fair-esm checkpoint: it has no 'model' weights"):
        model_folder(str(tensors))
    esm1 = tmp_path / "esm1_t6.pt"
    torch.save(
        {"model": {"embed_tokens.weight": torch.zeros(33, 4)}, "args": argparse.Namespace(arch="protein_bert_base")},
        esm1,
    )
    with pytest.raises(UserError, match="architecture 'protein_bert_base', which dscore does not convert"):
        model_folder(str(esm1))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    corpus = tmp_path / "c.txt"
    corpus.write_text("MKT\n")
    assert main(["score", str(corpus), "--model", str(garbage), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a PyTorch checkpoint" in err[0] and "Traceback" not in err[0]
    assert not list((cache / "fair-esm").glob("[!.]*"))  # nothing cached from a refused file
