"""The PLL engine: per-token log p(w_t | rest) for many sentences at once.

For each packed batch of masked copies (see `masking`), the encoder runs once, one hidden state per row
is gathered at its masked position, and only those rows go through the LM head and a float32
log-softmax. On CUDA the encoder runs under bf16/fp16 autocast while the head stays in float32
(float64 throughout for a model loaded in float64).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Sequence

import numpy as np
import torch

from .masking import MaskedBatch, Sentence, pack
from .models import MaskedLM

logger = logging.getLogger(__name__)


class PLLEngine:
    """Scores prepared sentences with one loaded model; results do not depend on the batching."""

    def __init__(self, mlm: MaskedLM, variant: str = "original", batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.variant = variant
        self.batch_tokens = batch_tokens or mlm.default_batch_tokens()

    def token_logprobs(self, sentences: Sequence[Sentence]) -> list[np.ndarray]:
        """Natural-log probability of each target token of each sentence, in target order (float64)."""
        out = [np.empty(len(s.targets), dtype=np.float64) for s in sentences]
        batches = pack(sentences, self.variant, self.batch_tokens, self.mlm.mask_token_id, self.mlm.pad_token_id)
        for batch in batches:
            for part, logprobs in self._forward_fitting(batch):
                for sentence in np.unique(part.sentence):
                    rows = part.sentence == sentence
                    out[sentence][part.slot[rows]] = logprobs[rows]
        return out

    def _forward_fitting(self, batch: MaskedBatch) -> list[tuple[MaskedBatch, np.ndarray]]:
        """Forward a batch; on a CUDA out-of-memory error halve the budget and retry it in halves."""
        try:
            return [(batch, self.forward(batch).double().cpu().numpy())]
        except torch.cuda.OutOfMemoryError:
            if len(batch) == 1:
                raise
            torch.cuda.empty_cache()
            self.batch_tokens = max(1, self.batch_tokens // 2)
            logger.warning("out of memory on a batch of %d rows; token budget halved to %d", len(batch), self.batch_tokens)
            first, second = batch.halves()
            return self._forward_fitting(first) + self._forward_fitting(second)

    @torch.inference_mode()
    def forward(self, batch: MaskedBatch) -> torch.Tensor:
        """(B,) log-probability of each row's label at its masked position."""
        device = self.mlm.device
        non_blocking = device.type == "cuda"
        input_ids = _to(batch.input_ids, device, non_blocking)  # (B, T)
        attention_mask = _to(batch.attention_mask, device, non_blocking)  # (B, T)
        positions = _to(batch.positions, device, non_blocking)  # (B,)
        labels = _to(batch.labels, device, non_blocking)  # (B,)
        rows = torch.arange(len(positions), device=device)
        with self._autocast():
            if self.mlm.head is None:
                logits = self.mlm.model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
                logits = logits[rows, positions]  # (B, V)
            else:
                hidden = self.mlm.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]  # (B, T, H)
                hidden = hidden[rows, positions]  # (B, H)
        if self.mlm.head is not None:
            with torch.autocast(device.type, enabled=False):
                logits = self.mlm.head(hidden.to(self.mlm.head_dtype))  # (B, V)
        logits = logits.to(self.mlm.head_dtype)
        return logits.gather(1, labels[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.mlm.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.mlm.device.type, dtype=dtype)


def _to(array: np.ndarray, device: torch.device, non_blocking: bool) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    if non_blocking:
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=non_blocking)
