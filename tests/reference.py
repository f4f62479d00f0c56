"""The naive PLL reference the engine is checked against, written independently of the engine.

One masked copy per forward pass, no batching, no padding, full logits, float64 model and
log-softmax. Which tokens are scored and which are masked is derived here from the tokenizer, not
from the package's own prepare/masking code.
"""

from __future__ import annotations

import copy

import numpy as np
import torch


def scored_positions(tokenizer, ids: list[int]) -> list[int]:
    """Every position except the sequence-level specials ([CLS]/[SEP], <s>/</s>, padding)."""
    specials = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id,
                tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    return [i for i, t in enumerate(ids) if t not in specials]


def masked_positions(word_ids: list, target: int, variant: str) -> list[int]:
    if variant == "original" or word_ids[target] is None:
        return [target]
    return [target] + [u for u in range(target + 1, len(word_ids)) if word_ids[u] == word_ids[target]]


class NaiveScorer:
    """Holds a copy of the model in `dtype` (float64 by default); the log-softmax is always float64."""

    def __init__(self, model, tokenizer, dtype: torch.dtype = torch.float64) -> None:
        self.model = copy.deepcopy(model).to(dtype).eval()
        self.tokenizer = tokenizer

    @torch.no_grad()
    def token_logprobs(self, text: str, variant: str = "original") -> np.ndarray:
        encoding = self.tokenizer(text)
        ids = encoding["input_ids"]
        word_ids = encoding.word_ids()
        out = []
        for t in scored_positions(self.tokenizer, ids):
            copy_ids = list(ids)
            for u in masked_positions(word_ids, t, variant):
                copy_ids[u] = self.tokenizer.mask_token_id
            logits = self.model(input_ids=torch.tensor([copy_ids])).logits[0, t].double()  # (V,)
            out.append(torch.log_softmax(logits, dim=-1)[ids[t]].item())
        return np.array(out)


class NaiveInfill:
    """Brute-force infilling: every fill of the allowed tokens, each scored along its order with one
    sequence per forward pass, full logits, float64 model and log-softmax (Calef et al.'s chain and HCB
    scores; see distributed_scoring/engine/infill.py for the definitions)."""

    def __init__(self, model, mask_id: int) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.mask_id = mask_id
        self.forwards = 0

    @torch.no_grad()
    def logp(self, ids: tuple[int, ...]) -> np.ndarray:
        """(L, V) log p of every position of this context."""
        self.forwards += 1
        logits = self.model(input_ids=torch.tensor([list(ids)])).logits[0].double()
        return torch.log_softmax(logits, dim=-1).numpy()

    def fills(self, ids: list[int], masks: list[int], allowed: list[int], order: str,
              pivot: int | None = None) -> list[tuple[tuple[int, ...], float, float, tuple[int, ...]]]:
        """(tokens in position order, chain score, HCB score, fill order) of every fill, unsorted."""
        pivot = self.mask_id if pivot is None else pivot
        out = []

        def visit(context: list[int], remaining: list[int], chain: float, hcb: float, done: tuple[int, ...]) -> None:
            if not remaining:
                out.append((tuple(context[m] for m in masks), chain, hcb, done))
                return
            logp = self.logp(tuple(context))
            if order == "l2r":
                position = remaining[0]
            else:  # best-to-worst: the largest log-probability over the vocabulary, ties to the leftmost
                peaks = [logp[p].max() for p in remaining]
                position = remaining[int(np.argmax(peaks))]
            for token in allowed:
                child = list(context)
                child[position] = token
                visit(child, [p for p in remaining if p != position], chain + logp[position, token],
                      hcb + logp[position, token] - logp[position, pivot], (*done, position))

        visit(list(ids), sorted(masks), 0.0, 0.0, ())
        return out
