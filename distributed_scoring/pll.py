"""The PLL engine: per-token log p(w_t | rest) for many sentences at once.

For each packed batch of masked copies (see `masking`), the encoder runs once, one hidden state per row
is gathered at its masked position, and only those rows go through the LM head and a float32
log-softmax. On CUDA the encoder runs under bf16/fp16 autocast while the head stays in float32
(float64 throughout for a model loaded in float64).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from .masking import MaskedBatch, Sentence, pack
from .models import MaskedLM, to_device

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
        labels = to_device(batch.labels, self.mlm.device)  # (B,)
        out, start = [], 0
        for logits in self.mlm.logits_at(batch.input_ids, batch.attention_mask, batch.positions):  # (C, V)
            rows = labels[start : start + len(logits)]
            out.append(logits.gather(1, rows[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1))
            start += len(logits)
        return torch.cat(out)
