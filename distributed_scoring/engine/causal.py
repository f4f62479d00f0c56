"""Exact sentence log-probabilities log P(W) from a causal LM, for N-best rescoring.

Convention (Salazar et al., 2020, appendix A.1): the sentence is wrapped in the model's
start and end tokens, `[BOS] w_1 ... w_n [EOS]`, and

    log P(W) = sum_{t=1..n} log p(w_t | BOS, w_<t) + log p(EOS | BOS, w_1..n),

so the end term tells a complete sentence from a truncated one. |W| = n counts the sentence's own
tokens, not BOS or EOS (they are not counted for length normalisation either). The sentence is
tokenised without the tokenizer's own special tokens, and the wrapping tokens are chosen as follows:

- BOS and EOS both defined (Llama, Mistral): `[BOS] W [EOS]`.
- One token for both, or only an EOS (GPT-2's `<|endoftext|>`, Qwen2, GPT-NeoX): that token on both
  sides, as the paper does for GPT-2 (the end-of-document token is the model's unconditional start).
- Only a BOS: `[BOS] W`, with no end term; `signature["eos"]` is then null.
- Neither: refused, since the first token would have no context to be conditioned on.

The engine packs sentences, longest first, into forward passes under a token budget (rows x padded
length), runs the decoder once per batch, gathers the hidden states of the positions that predict a
real token, and applies the LM head only to those rows, in chunks, so padding never goes through the
vocabulary projection and the (rows, vocab) logits stay bounded. By default the decoder runs under bf16
autocast on CUDA and the head in float32; with bf16 weights (`--dtype bfloat16`) the head runs in bf16
and its logits are cast to float32 before the log-softmax. Architectures outside `_PLAIN_HEADS` go through
the full logits (exact, slower).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..config import ModelSpec
from ..engine import packing
from .masked_lm import (
    CUDA_OUT_OF_MEMORY,
    DEFAULT_BATCH_TOKENS,
    OnDevice,
    apply_head,
    autocast_region,
    head_rows,
    load_pretrained,
    some_keys,
    to_device,
    warn_full_logits,
)
from .model_files import ModelLoadError, local_files_only, max_input_length, remote_code_refusal
from .packing import Piece, TokenBudget, run_fitting

# Causal-LM classes whose logits are exactly `get_output_embeddings()(base_model(...)[0])`: no logit
# scaling or soft-capping after the projection. Others are scored through their full logits.
_PLAIN_HEADS = {
    "GPT2LMHeadModel",
    "GPTNeoForCausalLM",
    "GPTNeoXForCausalLM",
    "GPTJForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "OPTForCausalLM",
}


@dataclass
class CausalLM:
    """A loaded causal LM ready for scoring; `eos_id` is None where the tokenizer has no end token."""

    model: torch.nn.Module
    tokenizer: Any
    device: torch.device
    autocast_dtype: torch.dtype | None
    weights_dtype: torch.dtype
    head_dtype: torch.dtype
    max_length: int
    bos_id: int
    eos_id: int | None
    head: Callable[[torch.Tensor], torch.Tensor] | None
    signature: dict

    @property
    def decoder(self) -> torch.nn.Module:
        return self.model.base_model

    @property
    def pad_id(self) -> int:
        """Any id works for right padding: causal attention never lets a real position see it."""
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.bos_id

    def default_batch_tokens(self) -> int:
        return DEFAULT_BATCH_TOKENS[self.device.type]


def boundary_ids(tokenizer: Any, name: str = "tokenizer") -> tuple[int, int | None]:
    """(start id, end id or None) wrapped around every sentence; see the module docstring."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None and eos is None:
        raise ModelLoadError(
            f"the {name} has neither a BOS nor an EOS token, so the first token of a sentence would have no "
            "context; causal scoring needs a model whose tokenizer defines one of them"
        )
    return (eos if bos is None else bos), eos


def load_causal_lm(spec: ModelSpec) -> CausalLM:
    """Load a causal LM and its tokenizer for inference; refuse folders that hold another kind of model.

    Safetensors weights are preferred; pickled checkpoints are only read with `weights_only=True`.
    """
    from transformers import AutoModelForCausalLM

    local_only = local_files_only(spec)  # the Hub asked once for the tokenizer and the weights
    config, tokenizer, bos_id, eos_id = load_causal_parts(spec, local_only)
    hint = "Pass a decoder LM (GPT-2, Llama, ...)."
    loaded = load_pretrained(AutoModelForCausalLM, spec, "causal LM", hint, local_only)
    model = loaded.model
    architecture = type(model).__name__
    if loaded.missing_keys:
        raise ModelLoadError(
            f"{spec.name!r} lacks {len(loaded.missing_keys)} weights of {architecture} "
            f"({some_keys(loaded.missing_keys)}); scoring would use randomly initialised layers. Use a checkpoint "
            "saved with its LM head."
        )
    if architecture not in _PLAIN_HEADS:
        warn_full_logits(architecture)
    max_length = max_input_length(config, tokenizer)
    return CausalLM(
        model=model,
        tokenizer=tokenizer,
        device=loaded.device,
        autocast_dtype=loaded.autocast_dtype,
        weights_dtype=loaded.weights_dtype,
        head_dtype=loaded.head_dtype,
        max_length=max_length,
        bos_id=bos_id,
        eos_id=eos_id,
        head=model.get_output_embeddings() if architecture in _PLAIN_HEADS else None,
        signature={
            **loaded.signature(spec, max_length),
            "bos": tokenizer.convert_ids_to_tokens(bos_id),
            "eos": None if eos_id is None else tokenizer.convert_ids_to_tokens(eos_id),
        },
    )


def load_causal_parts(spec: ModelSpec, local_only: bool | None = None) -> tuple[Any, Any, int, int | None]:
    """Config, tokenizer and boundary ids of a causal LM, checked, without its weights: what a run
    checks on the driver before any scoring starts, and what `load_causal_lm` builds on. `local_only`:
    `model_files.local_files_only(spec)`, where the caller has asked it already."""
    from transformers import AutoConfig, AutoTokenizer

    options = {
        "revision": spec.revision,
        "trust_remote_code": spec.trust_remote_code,
        # a Hub id offline: refused in seconds, not after minutes of retries
        "local_files_only": local_files_only(spec) if local_only is None else local_only,
    }
    try:
        config = AutoConfig.from_pretrained(spec.name, **options)
        tokenizer = AutoTokenizer.from_pretrained(spec.name, **options)
    except (OSError, ValueError, TypeError) as exc:
        raise remote_code_refusal(spec, exc) or ModelLoadError(
            f"could not load the configuration or tokenizer of {spec.name!r}: {exc}. Pass a local folder "
            "holding a HuggingFace causal LM (config.json, weights, tokenizer files) or a Hub id."
        ) from exc
    _check_causal(spec.name, config)
    bos_id, eos_id = boundary_ids(tokenizer, f"tokenizer of {spec.name!r}")
    return config, tokenizer, bos_id, eos_id


def _check_causal(name: str, config: Any) -> None:
    """A folder whose config names only non-causal classes (a masked LM, a classifier) is refused.

    transformers would otherwise load, say, a BERT masked LM as `BertLMHeadModel` with bidirectional
    attention, and every "log P" would peek at the words it predicts.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = getattr(config, "architectures", None) or []
    if architectures and not causal_classes.intersection(architectures):
        raise ModelLoadError(
            f"{name!r} holds a {', '.join(architectures)}, not a causal (left-to-right) LM; pass a model such "
            "as GPT-2, GPT-NeoX, Llama, Mistral, Qwen2 or OPT"
        )
    # Encoders that can act as decoders (BERT, RoBERTa, ...) do so only with `is_decoder` set.
    seq2seq = getattr(config, "is_encoder_decoder", False)
    encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not seq2seq
    if encoder and not getattr(config, "is_decoder", False):
        raise ModelLoadError(
            f"{name!r} is a {config.model_type} encoder with is_decoder=False: its attention is bidirectional, "
            "so it gives no left-to-right log P; pass a causal LM (GPT-2, Llama, ...)"
        )


def encode(lm: CausalLM, texts: Sequence[str]) -> list[np.ndarray | str]:
    """Token ids `[BOS] W [EOS]` of each text (int64), or why it cannot be scored (blank, too long)."""
    out: list[np.ndarray | str] = []
    todo = [i for i, t in enumerate(texts) if t.strip()]
    pieces = lm.tokenizer([texts[i] for i in todo], add_special_tokens=False)["input_ids"] if todo else []
    encoded = dict(zip(todo, pieces))
    tail = [] if lm.eos_id is None else [lm.eos_id]
    for i in range(len(texts)):
        if i not in encoded:
            out.append("empty or whitespace-only text")
            continue
        ids = np.array([lm.bos_id, *encoded[i], *tail], dtype=np.int64)
        if len(ids) > lm.max_length:
            out.append(
                f"sentence is {len(ids)} tokens long with BOS/EOS, over the model's maximum of {lm.max_length}; "
                "it was not truncated: split it, or use a model with more positions"
            )
        elif len(encoded[i]) == 0:
            out.append("the tokenizer produced no tokens for this text")
        else:
            out.append(ids)
    return out


def pack(lengths: Sequence[int], batch_tokens: int) -> list[np.ndarray]:
    """Indices of the sequences of each forward pass, longest first; rows x width <= budget (>= 1 row)."""
    return [_indices(batch) for batch in packing.pack(lengths, [1] * len(lengths), TokenBudget(batch_tokens))]


def _indices(batch: list[Piece]) -> np.ndarray:
    """The sequences of a batch of `packing` pieces: each sequence is a group of one row."""
    return np.array([piece.group for piece in batch], dtype=np.int64)


class CausalEngine:
    """Scores token sequences with one loaded causal LM; results do not depend on the batching."""

    def __init__(self, lm: CausalLM, batch_tokens: int | None = None) -> None:
        self.lm = lm
        self.budget = TokenBudget(batch_tokens or lm.default_batch_tokens())

    def token_logprobs(
        self, sequences: Sequence[np.ndarray], report: Callable[[int, int], None] | None = None
    ) -> list[np.ndarray]:
        """log p(ids[t] | ids[<t]) for t = 1..L-1 of each sequence, in order (float64).
        `report(tokens done, in all)` is called after each forward pass; the values stay on the device until
        the last pass has run and come to the host in one copy."""
        lengths = [len(s) for s in sequences]
        score = partial(self._score, sequences)
        total, done = sum(lengths), 0
        order: list[int] = []  # the sequences in the order their values were kept
        values = OnDevice()
        for pieces in packing.pack(lengths, [1] * len(lengths), self.budget):
            for part, flat in run_fitting(pieces, lengths, self.budget, score, CUDA_OUT_OF_MEMORY):
                batch = _indices(part).tolist()
                order += batch
                values.add(flat)
                done += sum(lengths[i] for i in batch)
                if report is not None:
                    report(done, total)
        out: list[np.ndarray] = [np.empty(0)] * len(sequences)
        for index, terms in zip(order, np.split(values.host(), np.cumsum([lengths[i] - 1 for i in order])[:-1])):
            out[index] = terms
        return out

    def _score(self, sequences: Sequence[np.ndarray], pieces: list[Piece]) -> torch.Tensor:
        """(R,) log-probabilities of the batch's sequences, concatenated, on the device, R = sum(L_b - 1)."""
        batch = _indices(pieces)
        lengths = np.array([len(sequences[i]) for i in batch])  # (B,)
        input_ids = np.full((len(batch), lengths[0]), self.lm.pad_id, dtype=np.int64)  # (B, T)
        for row, index in enumerate(batch):
            input_ids[row, : lengths[row]] = sequences[index]
        return self.forward(input_ids, lengths)

    @torch.inference_mode()
    def forward(self, input_ids: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
        """(R,) log-probability of every real token after the first, row by row, R = sum(lengths - 1)."""
        device = self.lm.device
        ids = to_device(input_ids, device)  # (B, T)
        n = to_device(lengths, device)  # (B,)
        width = ids.shape[1]
        attention_mask = (torch.arange(width, device=device)[None, :] < n[:, None]).long()  # (B, T)
        # Position t predicts token t + 1; the positions that predict a real token are t < L - 1.
        predicts = torch.arange(width - 1, device=device)[None, :] < (n - 1)[:, None]  # (B, T-1)
        labels = ids[:, 1:][predicts]  # (R,)
        with autocast_region(device, self.lm.autocast_dtype):
            if self.lm.head is None:
                logits = self.lm.model(input_ids=ids, attention_mask=attention_mask).logits  # (B, T, V)
                rows = logits[:, :-1][predicts]  # (R, V)
            else:
                hidden = self.lm.decoder(input_ids=ids, attention_mask=attention_mask)[0]  # (B, T, H)
                rows = hidden[:, :-1][predicts]  # (R, H)
        out = torch.empty(len(labels), dtype=self.lm.head_dtype, device=device)
        step = head_rows(self.lm.model.config.vocab_size)
        for start in range(0, len(labels), step):
            chunk = slice(start, start + step)
            logits = self._head(rows[chunk])  # (C, V), head dtype
            out[chunk] = logits.gather(1, labels[chunk, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
        return out

    def _head(self, rows: torch.Tensor) -> torch.Tensor:
        """(C, H) hidden states -> (C, V) logits in the head dtype; (C, V) full-model logits are just cast."""
        if self.lm.head is None:
            return rows.to(self.lm.head_dtype)
        return apply_head(self.lm.head, rows, self.lm.weights_dtype, self.lm.head_dtype)
