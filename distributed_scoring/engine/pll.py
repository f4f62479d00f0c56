"""The PLL engine: per-token log p(w_t | rest) for many sentences at once.

For each packed batch of masked copies (see `masking`), the encoder runs once, one hidden state per row
is gathered at its masked position, and only those rows go through the LM head and a float32
log-softmax. On CUDA the encoder runs under bf16/fp16 autocast by default while the head stays in float32
(float64 throughout for a model loaded in float64); with bf16 weights the head runs in bf16 and its
logits are cast to float32 first. Each call's values stay on the device until its last batch has run
and come to the host in one copy (`masked_lm.OnDevice`).

With `token_conditionals` the same passes also keep, at each scored position, the k most probable tokens of
the conditional and the log of the mass of all the others: what a distilled student is fitted to
(`dscore train maskless --target distribution`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM, OnDevice, to_device
from .masking import MaskedBatch, Sentence, build, shape_of
from .packing import Piece, TokenBudget, pack, run_fitting


@dataclass(frozen=True)
class Conditionals:
    """One sentence's scored positions: the PLL's terms and the top of each conditional log p(. | W without w_t)."""

    logprobs: np.ndarray  # (n,) float64 log p(w_t | W without w_t): the PLL's terms
    ids: np.ndarray  # (n, k) int64 the k most probable tokens at t, most probable first
    top: np.ndarray  # (n, k) float64 their log-probabilities
    rest: np.ndarray  # (n,) float64 log of the probability of every other token (-inf when k covers V)


class PLLEngine:
    """Scores prepared sentences with one loaded model; results do not depend on the batching."""

    def __init__(self, mlm: MaskedLM, variant: str = "original", batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.variant = variant
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())
        self.passes = 0  # masked copies run through the model (a batch of 32 copies is 32 passes)
        self.batches = 0  # model calls

    @property
    def batch_tokens(self) -> int:
        """The current token budget: the one given, halved after each batch that ran out of memory."""
        return self.budget.tokens

    def token_logprobs(
        self, sentences: Sequence[Sentence], report: Callable[[int, int], None] | None = None
    ) -> list[np.ndarray]:
        """Natural-log probability of each target token of each sentence, in target order (float64).
        `report(tokens of masked copies done, in all)` is called after each forward pass (tokens, not
        copies: the longest sentences go first and cost the most per copy)."""
        return [values[:, 0] for values in self._per_target(sentences, 1, self.forward, report)]

    def token_conditionals(
        self, sentences: Sequence[Sentence], k: int, report: Callable[[int, int], None] | None = None
    ) -> list[Conditionals]:
        """The PLL's terms and the top `k` of each conditional (all of it when k >= V), from the same passes."""
        k = min(k, self.mlm.model.config.vocab_size)
        out = []
        for values in self._per_target(sentences, 2 + 2 * k, lambda batch: self.forward_top(batch, k), report):
            out.append(
                Conditionals(
                    values[:, 0], values[:, 1 : 1 + k].astype(np.int64), values[:, 1 + k : 1 + 2 * k], values[:, -1]
                )
            )
        return out

    def token_table(
        self, sentences: Sequence[Sentence], ids: np.ndarray, report: Callable[[int, int], None] | None = None
    ) -> list[np.ndarray]:
        """(n, len(ids)) float64 per sentence: log p(ids[j] at target t | the copy with t masked), in target
        order: the masked marginals of variant effects (`engine.variants`), from the same passes as the PLL."""
        vocab = torch.as_tensor(np.asarray(ids, dtype=np.int64))

        def forward(batch: MaskedBatch) -> torch.Tensor:
            out = []
            with torch.inference_mode():
                for logits in self.mlm.logits_at(batch.input_ids, batch.attention_mask, batch.positions):  # (C, V)
                    out.append((logits - torch.logsumexp(logits, dim=-1, keepdim=True))[:, vocab.to(logits.device)])
            return torch.cat(out)  # (B, A)

        return self._per_target(sentences, len(vocab), forward, report)

    def _per_target(
        self,
        sentences: Sequence[Sentence],
        width: int,
        forward: Callable[[MaskedBatch], torch.Tensor],
        report: Callable[[int, int], None] | None,
    ) -> list[np.ndarray]:
        """(n, width) float64 per sentence: `forward`'s row for each target, whatever the packing. The rows
        stay on the device until the last batch has run, then come to the host in one copy."""
        lengths, counts = shape_of(sentences)
        total, done = int(np.dot(lengths, counts)), 0
        kept, values = [], OnDevice()  # each batch's (sentence, slot) of its rows; their values

        def score(pieces: list[Piece]) -> tuple[MaskedBatch, torch.Tensor]:
            batch = build(sentences, pieces, self.variant, self.mlm.mask_token_id, self.mlm.pad_token_id)
            return batch, forward(batch).reshape(len(batch), width)

        for pieces in pack(lengths, counts, self.budget):
            for part, (batch, rows) in run_fitting(pieces, lengths, self.budget, score, CUDA_OUT_OF_MEMORY):
                self.passes += len(batch)
                self.batches += 1
                kept.append((batch.sentence, batch.slot))
                values.add(rows)
                done += sum(piece.rows * lengths[piece.group] for piece in part)
                if report is not None:
                    report(done, total)
        starts = np.cumsum([0, *(len(s.targets) for s in sentences)])  # sentence j's rows: starts[j]..starts[j+1]
        out = np.empty((starts[-1], width), dtype=np.float64)
        if kept:
            out[starts[np.concatenate([k[0] for k in kept])] + np.concatenate([k[1] for k in kept])] = values.host()
        return np.split(out, starts[1:-1])

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

    @torch.inference_mode()
    def forward_top(self, batch: MaskedBatch, k: int) -> torch.Tensor:
        """(B, 2 + 2k): per row the label's log-probability, the ids of the k most probable tokens (exact as
        floats), their log-probabilities, and the log of the mass of the rest (-inf when k = V)."""
        labels = to_device(batch.labels, self.mlm.device)  # (B,)
        out, start = [], 0
        for logits in self.mlm.logits_at(batch.input_ids, batch.attention_mask, batch.positions):  # (C, V)
            logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (C, V)
            rows = labels[start : start + len(logits)]
            top, ids = logp.topk(k, dim=-1)  # (C, k) each, most probable first
            rest = torch.logsumexp(logp.scatter(1, ids, float("-inf")), dim=-1)  # (C,)
            out.append(torch.cat([logp.gather(1, rows[:, None]), ids.to(logp.dtype), top, rest[:, None]], dim=1))
            start += len(logits)
        return torch.cat(out)
