"""A fair-esm checkpoint (ESM-1b, ESM-1v, ESM-2: the `.pt` files `esm.pretrained` loads and ProteinGym's
scripts keep) as a transformers model folder: `EsmForMaskedLM` weights, its `EsmConfig` and an `EsmTokenizer`
whose vocabulary is ESM's alphabet token for token, so every engine reads it as it reads facebook/esm2_*.

The weights are mapped name for name, as fair-esm's own loader reads them (`esm.pretrained`,
`_load_model_and_alphabet_core_v1/v2`); fair-esm itself is not needed. Run by the driver in a child process
(`python -m distributed_scoring.engine.esm_checkpoint CHECKPOINT FOLDER`, see `offline.fair_esm`), since
the driver never imports torch; torch is imported here only inside the functions that need it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError, error_reason

# ESM's alphabet (`esm.data.Alphabet.from_architecture("ESM-1b")`, which ESM-1b, ESM-1v and ESM-2 share):
# the position of a token is its row in the embedding and in the LM head.
ALPHABET = (
    *("<cls>", "<pad>", "<eos>", "<unk>"),
    *"LAGVSERTIDPKQNFYMHWCXBUZO.-",
    *("<null_1>", "<mask>"),
)
PAD_ID, MASK_ID = ALPHABET.index("<pad>"), ALPHABET.index("<mask>")
# fair-esm's checkpoints prefix their weights with the fairseq modules that held them (`upgrade_state_dict`).
_PREFIX = re.compile(r"^(encoder\.sentence_encoder\.|encoder\.)")
# fair-esm name -> transformers name; `{i}` a layer. The contact head predicts contacts, not tokens: dropped.
_LAYER_NAMES = {
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_layer_norm": "attention.LayerNorm",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
    "final_layer_norm": "LayerNorm",
}
_NAMES = {
    "embed_positions": "esm.embeddings.position_embeddings",
    "emb_layer_norm_before": "esm.embeddings.layer_norm",
    "emb_layer_norm_after": "esm.encoder.emb_layer_norm_after",
    "lm_head.dense": "lm_head.dense",
    "lm_head.layer_norm": "lm_head.layer_norm",
    "lm_head.bias": "lm_head.bias",
}
_ROTARY = re.compile(r"^layers\.\d+\.self_attn\.rot_emb\.inv_freq$")
# The weights the converted model may lack: its contact head (dropped) and the LM head's decoder (tied to the
# embedding, as fair-esm's `RobertaLMHead` is).
_ALLOWED_MISSING = {"esm.contact_head.regression.weight", "esm.contact_head.regression.bias", "lm_head.decoder.weight"}
# What torch's weights-only unpickler names when a checkpoint holds an object it does not read.
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL (\S+)")
ESM2_MAX_POSITIONS = 1026  # rotary positions have no table; facebook/esm2_* configs state this bound


@dataclass(frozen=True)
class Architecture:
    """What a checkpoint's settings and weights say of its model: ESM-1b/1v (learned positions, maybe a layer
    norm before the encoder) or ESM-2 (rotary positions)."""

    name: str
    layers: int
    heads: int
    token_dropout: bool
    rotary: bool


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's dictionary, read weights-only: tensors and the settings' `argparse.Namespace`, no
    other objects (unpickling those could run code)."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        found = _UNSUPPORTED.search(str(exc))
        if found:
            raise UserError(
                f"{path} holds objects other than tensors and settings ({found.group(1)}), so it is not read "
                "(unpickling them can run code): pass a checkpoint as fair-esm saves it (ESM-1b, ESM-1v, ESM-2)"
            ) from exc
        # torch's own words on an unreadable pickle are advice on weights_only, beside the point here
        reason = "not a pickle torch.load reads" if isinstance(exc, pickle.UnpicklingError) else error_reason(exc)
        raise UserError(f"{path} is not a PyTorch checkpoint ({reason}): pass a fair-esm .pt file") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise UserError(f"{path} is not a fair-esm checkpoint: it has no 'model' weights ({_keys(data)})")
    return data


def _keys(data: Any) -> str:
    return f"keys {sorted(map(str, data))}" if isinstance(data, dict) else f"a {type(data).__name__}"


def _setting(settings: Any, name: str) -> Any:
    """A fairseq setting, under its encoder_ name or its bare one (fair-esm strips the prefix on load)."""
    value = getattr(settings, f"encoder_{name}", None)
    return getattr(settings, name, None) if value is None else value


def architecture(path: Path, data: dict, state: dict) -> Architecture:
    """ESM-1b/1v where `args` name fairseq's roberta_large, ESM-2 where `cfg` holds the model's settings; any
    other fair-esm model (ESM-1, the MSA Transformer, inverse folding) is refused."""
    args, cfg = data.get("args"), data.get("cfg")
    model_cfg = cfg.get("model") if isinstance(cfg, dict) else None
    layers = len({key.split(".")[1] for key in state if key.startswith("layers.")})
    if getattr(args, "arch", None) == "roberta_large":
        settings, name, rotary = args, "ESM-1b", False
    elif model_cfg is not None:
        settings, name, rotary = model_cfg, "ESM-2", True
    else:
        arch = getattr(args, "arch", None) or getattr(model_cfg, "_name", None)
        raise UserError(
            f"{path} is a fair-esm checkpoint of architecture {arch!r}, which dscore does not convert: ESM-1b, "
            "ESM-1v (args.arch 'roberta_large') and ESM-2 (with a 'cfg') are converted"
        )
    heads = _setting(settings, "attention_heads")
    if not heads or _setting(settings, "layers") not in (None, layers):
        raise UserError(
            f"{path}: its settings (attention heads {heads}, layers {_setting(settings, 'layers')}) do not describe "
            f"its {layers} layers of weights; the checkpoint is damaged"
        )
    return Architecture(name, layers, int(heads), bool(getattr(settings, "token_dropout", False)), rotary)


def transformers_state(state: dict, arch: Architecture) -> dict:
    """The weights under `EsmForMaskedLM`'s names. fair-esm ties its LM head to the embedding and loads the
    head's copy last, so that copy is the embedding; for ESM-1b/1v it zeroes the <mask> row of the embedding
    first (token dropout), in the tensor the head shares where the file shares it. The contact head predicts
    contacts, not tokens: dropped."""
    if not arch.rotary:
        state["embed_tokens.weight"][MASK_ID].zero_()
    mapped = {"esm.embeddings.word_embeddings.weight": state["lm_head.weight"]}
    rotary = sorted(key for key in state if _ROTARY.match(key))
    if rotary:  # one table in transformers; fair-esm's, rounded as it was trained, kept rather than recomputed
        mapped["esm.rotary_embeddings.inv_freq"] = state[rotary[0]]
    skipped = {"embed_tokens.weight", "lm_head.weight", *rotary}
    for key, tensor in state.items():
        if key not in skipped and not key.startswith("contact_head."):
            mapped[_transformers_name(key)] = tensor
    return mapped


def _transformers_name(key: str) -> str:
    if key.startswith("layers."):
        _, index, rest = key.split(".", 2)
        module, parameter = rest.rsplit(".", 1)
        return f"esm.encoder.layer.{index}.{_LAYER_NAMES.get(module, module)}.{parameter}"
    for name, mapped in _NAMES.items():
        if key == name or key.startswith(f"{name}."):
            return mapped + key[len(name) :]
    return key  # unknown: left as it is, for the load to name it


def convert(checkpoint: Path, dest: Path) -> None:
    """Write the transformers folder of a fair-esm checkpoint into `dest` (an existing, empty folder)."""
    import torch
    from transformers import EsmConfig, EsmForMaskedLM, EsmTokenizer

    data = read_checkpoint(checkpoint)
    state = {_PREFIX.sub("", key): tensor for key, tensor in data["model"].items()}
    arch = architecture(checkpoint, data, state)
    embedding = state.get("embed_tokens.weight")
    if embedding is None or "lm_head.weight" not in state or embedding.shape[0] != len(ALPHABET):
        raise UserError(
            f"{checkpoint}: a {arch.name} checkpoint needs an embedding of {len(ALPHABET)} tokens (ESM's alphabet) "
            f"and an LM head; it has {None if embedding is None else tuple(embedding.shape)} and "
            f"{'an' if 'lm_head.weight' in state else 'no'} LM head"
        )
    positions = state.get("embed_positions.weight")
    config = EsmConfig(
        vocab_size=len(ALPHABET),
        mask_token_id=MASK_ID,
        pad_token_id=PAD_ID,
        hidden_size=embedding.shape[1],
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        intermediate_size=state["layers.0.fc1.weight"].shape[0],
        max_position_embeddings=ESM2_MAX_POSITIONS if positions is None else positions.shape[0],
        layer_norm_eps=1e-5,  # torch's LayerNorm default, which fair-esm's ESM-1b and ESM-2 layers use
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        emb_layer_norm_before="emb_layer_norm_before.weight" in state,
        token_dropout=arch.token_dropout,
        position_embedding_type="rotary" if arch.rotary else "absolute",
        vocab_list=list(ALPHABET),
        architectures=["EsmForMaskedLM"],
    )
    model = EsmForMaskedLM(config).eval()
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(transformers_state(state, arch), strict=False)
    if unexpected or set(missing) - _ALLOWED_MISSING:
        raise UserError(
            f"{checkpoint}: its {arch.name} weights do not match the {arch.name} architecture (not in the "
            f"checkpoint: {sorted(set(missing) - _ALLOWED_MISSING)}; not in the model: {sorted(unexpected)})"
        )
    model.save_pretrained(dest)
    vocab = dest / "vocab.txt"
    vocab.write_text("\n".join(ALPHABET) + "\n")
    # ESM-1b's learned positions hold the pad offset and one row more than its longest input (fairseq's layout).
    longest = ESM2_MAX_POSITIONS if positions is None else positions.shape[0] - PAD_ID - 1
    tokenizer = EsmTokenizer(str(vocab), model_max_length=longest)
    if tokenizer.convert_tokens_to_ids(list(ALPHABET)) != list(range(len(ALPHABET))):
        raise AssertionError("EsmTokenizer's ids differ from ESM's alphabet")
    tokenizer.save_pretrained(dest)


def main(argv: list[str] | None = None) -> int:
    """The child process's entry: convert, and say a user's problem in one line (exit 2) for the driver."""
    parser = argparse.ArgumentParser(description="convert a fair-esm checkpoint to a transformers folder")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        convert(args.checkpoint, args.dest)
    except UserError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
