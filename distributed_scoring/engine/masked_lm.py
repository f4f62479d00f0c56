"""Loading masked LMs and their tokenizers, and splitting each model into encoder and LM head.

The PLL engine needs the vocabulary projection only at the masked position of every copy, so it runs
the encoder over the batch, gathers one hidden state per row and applies the head to those rows alone.
That needs to know, per architecture, which modules form the head: `_HEADS` says so. An architecture
missing from it still scores exactly, through the full model and a gather of its logits (slower).

Weights load in float32 (float64, bfloat16 or float16 when asked: `WEIGHTS_DTYPES`); `auto` runs float32
weights under bf16 autocast on CUDA. Whatever the weights, the head's logits leave it in float32 (float64
for float64 weights), so every log-softmax over the vocabulary is taken in float32 or better.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..config import ModelSpec
from ..quiet import no_progress_bars
from ..versions import versions
from .model_files import ModelLoadError, load_error, load_tokenizer, local_files_only, remote_code_refusal
from .packing import OutOfMemory

logger = logging.getLogger(__name__)

# Default token budget of one forward pass (rows x padded length), per device type.
DEFAULT_BATCH_TOKENS = {"cpu": 1024, "cuda": 65536}

# What every engine catches to halve its budget and retry a batch in parts (see `packing.run_fitting`).
CUDA_OUT_OF_MEMORY = OutOfMemory(torch.cuda.OutOfMemoryError, torch.cuda.empty_cache)

# Logits computed per LM-head call: bounds the (rows, V) block (256 MB in float32) for large vocabularies.
HEAD_ELEMENTS = 1 << 26

# --dtype -> the dtype the weights are loaded in (`auto` adds bf16 autocast on CUDA: `resolve_autocast_dtype`).
WEIGHTS_DTYPES = {
    "auto": torch.float32,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# Checkpoint keys whose absence says nothing about the LM head.
_BENIGN_MISSING = ("position_ids", "token_type_ids")


def _sequential(*modules: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return nn.Sequential(*modules)


def _deberta_v2_head(m: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if getattr(m, "legacy", True):
        return m.cls
    return lambda h: m.lm_predictions(h, m.deberta.embeddings.word_embeddings)


# Class name -> the callable mapping final hidden states (N, H) to vocabulary logits (N, V).
_HEADS: dict[str, Callable[[nn.Module], Callable[[torch.Tensor], torch.Tensor]]] = {
    "BertForMaskedLM": lambda m: m.cls,
    "RobertaForMaskedLM": lambda m: m.lm_head,
    "XLMRobertaForMaskedLM": lambda m: m.lm_head,
    "XLMRobertaXLForMaskedLM": lambda m: m.lm_head,
    "CamembertForMaskedLM": lambda m: m.lm_head,
    "EsmForMaskedLM": lambda m: m.lm_head,
    "DistilBertForMaskedLM": lambda m: _sequential(
        m.vocab_transform, m.activation, m.vocab_layer_norm, m.vocab_projector
    ),
    "AlbertForMaskedLM": lambda m: m.predictions,
    "ElectraForMaskedLM": lambda m: _sequential(m.generator_predictions, m.generator_lm_head),
    "ModernBertForMaskedLM": lambda m: _sequential(m.head, m.decoder),
    "DebertaForMaskedLM": lambda m: m.cls,
    "DebertaV2ForMaskedLM": _deberta_v2_head,
}


@dataclass
class MaskedLM:
    """A loaded masked LM ready for scoring.

    `head` is None for architectures outside `_HEADS`; the engine then takes logits from the full model.
    `autocast_dtype` is None when the encoder runs in its weights' dtype (`weights_dtype`); `head_dtype`, the
    dtype of the logits handed out, is float32, or float64 when the model was loaded in float64.
    """

    model: nn.Module
    tokenizer: Any
    device: torch.device
    autocast_dtype: torch.dtype | None
    weights_dtype: torch.dtype
    head_dtype: torch.dtype
    max_length: int
    head: Callable[[torch.Tensor], torch.Tensor] | None
    signature: dict

    @property
    def encoder(self) -> nn.Module:
        return self.model.base_model

    @property
    def mask_token_id(self) -> int:
        return self.tokenizer.mask_token_id

    @property
    def pad_token_id(self) -> int:
        """Any id works for padding (the attention mask hides it); prefer the tokenizer's own."""
        pad = self.tokenizer.pad_token_id
        return self.mask_token_id if pad is None else pad

    def default_batch_tokens(self) -> int:
        return DEFAULT_BATCH_TOKENS[self.device.type]

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast_region(self.device, self.autocast_dtype)

    @torch.inference_mode()
    def logits_at(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, positions: np.ndarray, rows: np.ndarray | None = None
    ) -> Iterator[torch.Tensor]:
        """Vocabulary logits (in `head_dtype`) at `positions`, in chunks, in order: one position per row,
        or, with `rows`, position i of row `rows[i]` (several positions of one row, as infilling needs).

        The encoder runs once over the batch; only the gathered hidden states go through the head, at
        most `HEAD_ELEMENTS` logits at a time. Without a head-table entry, the full model's logits are
        gathered instead (exact, slower).
        """
        ids = to_device(input_ids, self.device)  # (B, T)
        mask = to_device(attention_mask, self.device)  # (B, T)
        at = to_device(positions, self.device)  # (Q,)
        rows = torch.arange(len(at), device=self.device) if rows is None else to_device(rows, self.device)  # (Q,)
        with self.autocast():
            if self.head is None:
                yield self.model(input_ids=ids, attention_mask=mask).logits[rows, at].to(self.head_dtype)  # (Q, V)
                return
            hidden = self.encoder(input_ids=ids, attention_mask=mask)[0][rows, at]  # (Q, H)
        chunk = head_rows(self.model.config.vocab_size)
        for start in range(0, len(hidden), chunk):
            yield apply_head(self.head, hidden[start : start + chunk], self.weights_dtype, self.head_dtype)  # (C, V)


def apply_head(
    head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, weights_dtype: torch.dtype, out: torch.dtype
) -> torch.Tensor:
    """(C, H) final hidden states -> (C, V) logits in `out`: the head runs in its weights' dtype, outside
    autocast (float32 weights under autocast: a float32 head; bf16 weights: a bf16 head whose logits are cast
    up, so the log-softmax after it is taken in float32)."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(weights_dtype)).to(out)


def head_rows(vocab_size: int) -> int:
    """Rows the LM head takes at once, so that one call makes at most `HEAD_ELEMENTS` logits."""
    return max(1, HEAD_ELEMENTS // vocab_size)


def warn_full_logits(architecture: str) -> None:
    logger.warning("%s is not in the head table; scoring it through full logits (exact, but slower)", architecture)


def some_keys(keys: list[str], most: int = 6) -> str:
    """The first `most` of `keys`, sorted, for an error message."""
    return ", ".join(sorted(keys)[:most]) + (" ..." if len(keys) > most else "")


# Attention kernels in the order tried under CUDA autocast. On an H200 (benchmarks/gpu_profile.py
# --backends, bert-base, 2,000 sentences, eager), the memory-efficient kernel scored 1.23x the sentences/s
# of the default (cuDNN) on 8-25-word sentences and 1.09x on LibriSpeech-like lengths: the cuDNN kernel's
# 64x128 tiles are mostly padding on sentences of 20-40 tokens.
CUDA_ATTENTION = (
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
)


def autocast_region(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed-precision region of the encoder/decoder; no autocast when the model runs in its weights' dtype.
    On CUDA the attention kernels are tried in `CUDA_ATTENTION`'s order whatever the dtype: bf16 weights run
    the same half-precision kernels as bf16 autocast (float32 and float64 have no cuDNN or flash kernel to
    skip)."""
    region = contextlib.ExitStack()
    if dtype is not None:
        region.enter_context(torch.autocast(device.type, dtype=dtype))
    if device.type == "cuda":
        region.enter_context(sdpa_kernel(list(CUDA_ATTENTION), set_priority=True))
    return region


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on the device: pinned and copied asynchronously to a GPU."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class OnDevice:
    """A call's values kept on the device, batch after batch, and brought to the host in one copy (`host`).

    A copy per batch makes the host wait for each batch to finish before it packs and sends the next; kept
    here, the device runs the batches back to back. Values beyond `HEAD_ELEMENTS` come over in parts of
    about that size, so that what a call keeps never holds more device memory than one head call's logits.
    """

    def __init__(self) -> None:
        self._device: list[torch.Tensor] = []
        self._host: list[np.ndarray] = []
        self._held = 0

    def add(self, values: torch.Tensor) -> None:
        """Keep a batch's (rows, ...) values, in float64, after the ones added before."""
        self._device.append(values.double())
        self._held += values.numel()
        if self._held >= HEAD_ELEMENTS:
            self._copy()

    def host(self) -> np.ndarray:
        """Every value added, in order, joined along the first dimension: float64 on the host (empty if none)."""
        self._copy()
        return np.concatenate(self._host) if self._host else np.empty(0)

    def _copy(self) -> None:
        if self._device:
            self._host.append(torch.cat(self._device).cpu().numpy())
            self._device, self._held = [], 0


def resolve_device(device: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; asking for CUDA without one is an error, not a fallback."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device {device!r} was asked for but torch sees no CUDA device: use --device=cpu, or "
            "--device=auto (CUDA where there is one, else the CPU)"
        )
    return torch.device(device)


def resolve_autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The encoder's autocast dtype: for `auto`, bf16 (fp16 on GPUs without bf16) on CUDA and none on CPU;
    none for a named dtype, whose weights are loaded in it (`WEIGHTS_DTYPES`)."""
    if dtype != "auto" or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@dataclass
class Loaded:
    """A model fresh from `load_pretrained`: on its device, in eval mode, with its dtypes."""

    model: nn.Module
    missing_keys: list[str]
    device: torch.device
    autocast_dtype: torch.dtype | None
    weights_dtype: torch.dtype

    @property
    def head_dtype(self) -> torch.dtype:
        """The dtype of the logits the head hands out: float64 for float64 weights, else float32."""
        return torch.float64 if self.weights_dtype == torch.float64 else torch.float32

    def signature(self, spec: ModelSpec, max_length: int) -> dict:
        """The reproducibility signature every score records (model, revision, dtype, versions...): `dtype`
        is what the encoder computes in, `weights_dtype` what its weights are held in (bfloat16 over float32
        weights is autocast; over bfloat16 weights, bf16 weights)."""
        return {
            "model": spec.name,
            "revision": spec.revision or getattr(self.model.config, "_commit_hash", None),
            "architecture": type(self.model).__name__,
            "dtype": _name(self.autocast_dtype or self.weights_dtype),
            "weights_dtype": _name(self.weights_dtype),
            "device": self.device.type,
            "max_length": max_length,
            **versions(),
        }


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_pretrained(auto_class: Any, spec: ModelSpec, kind: str, hint: str, local_only: bool | None = None) -> Loaded:
    """`auto_class.from_pretrained` with the project's rules: weights in `WEIGHTS_DTYPES[spec.dtype]`,
    safetensors preferred, pickles only weights-only, from this machine alone where the Hub cannot be reached
    (`local_only`, asked here when not given: `model_files.local_files_only`), and errors that say what to do."""
    device = resolve_device(spec.device)
    weights_dtype = WEIGHTS_DTYPES[spec.dtype]
    local_only = local_files_only(spec) if local_only is None else local_only
    try:
        # transformers picks SDPA attention by default where the architecture has it (eager otherwise).
        with no_progress_bars():
            model, info = auto_class.from_pretrained(
                spec.name,
                revision=spec.revision,
                dtype=weights_dtype,
                weights_only=True,
                output_loading_info=True,
                trust_remote_code=spec.trust_remote_code,
                local_files_only=local_only,
            )
    except ValueError as exc:
        raise remote_code_refusal(spec, exc) or ModelLoadError(
            f"{spec.name!r} cannot be loaded as a {kind}: {exc}. {hint}"
        ) from exc
    except OSError as exc:
        raise load_error(spec, "weights", exc) from exc
    except SafetensorError as exc:
        raise ModelLoadError(
            f"the safetensors weights of {spec.name!r} are damaged ({exc}): download or convert the model "
            "again (a partial copy or an interrupted download leaves such files)"
        ) from exc
    except pickle.UnpicklingError as exc:
        raise ModelLoadError(
            f"refused to load the pickled checkpoint of {spec.name!r}: it holds objects other than tensors, "
            "and pickles are only read weights-only (unpickling arbitrary objects can run code). If you "
            "trust its source, convert it to safetensors there."
        ) from exc
    model.eval().to(device)
    return Loaded(
        model, list(info.get("missing_keys", [])), device, resolve_autocast_dtype(spec.dtype, device), weights_dtype
    )


def load_masked_lm(spec: ModelSpec) -> MaskedLM:
    """Load a masked LM with its head for inference; refuse checkpoints that lack MLM head weights.

    Safetensors weights are preferred; pickled checkpoints are only read with `weights_only=True`.
    """
    from transformers import AutoModelForMaskedLM

    local_only = local_files_only(spec)  # the Hub asked once for the tokenizer and the weights
    tokenizer, max_length = load_tokenizer(spec, local_only)
    loaded = load_pretrained(
        AutoModelForMaskedLM,
        spec,
        "masked LM",
        "Masked-LM scoring needs an encoder "
        "with an MLM head (BERT, RoBERTa, ALBERT, ELECTRA, DeBERTa, ModernBERT, ...).",
        local_only,
    )
    model = loaded.model
    missing = [k for k in loaded.missing_keys if not k.endswith(_BENIGN_MISSING)]
    if missing:
        raise ModelLoadError(
            f"{spec.name!r} has no trained masked-LM head: {len(missing)} weights are missing from the "
            f"checkpoint ({some_keys(missing)}). It was probably saved from a bare encoder or a fine-tuned classifier; "
            "scoring it would use a randomly initialised head. Use a checkpoint saved with its MLM head."
        )
    head_factory = _HEADS.get(type(model).__name__)
    if head_factory is None:
        warn_full_logits(type(model).__name__)
    return MaskedLM(
        model=model,
        tokenizer=tokenizer,
        device=loaded.device,
        autocast_dtype=loaded.autocast_dtype,
        weights_dtype=loaded.weights_dtype,
        head_dtype=loaded.head_dtype,
        max_length=max_length,
        head=head_factory(model) if head_factory else None,
        signature={**loaded.signature(spec, max_length), "attention": model.config._attn_implementation},
    )
