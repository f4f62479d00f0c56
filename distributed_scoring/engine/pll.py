"""The PLL engine: per-token log p(w_t | rest) for many sentences at once.

For each packed batch of masked copies (see `masking`), the encoder runs once, one hidden state per row
is gathered at its masked position, and only those rows go through the LM head and a float32
log-softmax. On CUDA the encoder runs under bf16/fp16 autocast while the head stays in float32
(float64 throughout for a model loaded in float64).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .masking import MaskedBatch, Sentence, build, shape_of
from .models import CUDA_OUT_OF_MEMORY, MaskedLM, to_device
from .packing import Piece, TokenBudget, pack, run_fitting


class PLLEngine:
    """Scores prepared sentences with one loaded model; results do not depend on the batching."""

    def __init__(self, mlm: MaskedLM, variant: str = "original", batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.variant = variant
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())

    @property
    def batch_tokens(self) -> int:
        """The current token budget: the one given, halved after each batch that ran out of memory."""
        return self.budget.tokens

    def token_logprobs(self, sentences: Sequence[Sentence],
                       report: Callable[[int, int], None] | None = None) -> list[np.ndarray]:
        """Natural-log probability of each target token of each sentence, in target order (float64).
        `report(tokens of masked copies done, in all)` is called after each forward pass (tokens, not
        copies: the longest sentences go first and cost the most per copy)."""
        out = [np.empty(len(s.targets), dtype=np.float64) for s in sentences]
        lengths, counts = shape_of(sentences)
        total, done = int(np.dot(lengths, counts)), 0

        def score(pieces: list[Piece]) -> tuple[MaskedBatch, np.ndarray]:
            batch = build(sentences, pieces, self.variant, self.mlm.mask_token_id, self.mlm.pad_token_id)
            return batch, self.forward(batch).double().cpu().numpy()

        for pieces in pack(lengths, counts, self.budget):
            for part, (batch, logprobs) in run_fitting(pieces, lengths, self.budget, score, CUDA_OUT_OF_MEMORY):
                for sentence in np.unique(batch.sentence):
                    rows = batch.sentence == sentence
                    out[sentence][batch.slot[rows]] = logprobs[rows]
                done += sum(piece.rows * lengths[piece.group] for piece in part)
                if report is not None:
                    report(done, total)
        return out

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
