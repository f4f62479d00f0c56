"""The energies of sequences under a masked LM, the targets of Metropolis-Hastings sampling (`sampler`,
Goyal, Dyer & Berg-Kirkpatrick, 2022).

A sequence X of token ids has scored positions S (every position but the sequence-level
specials, see `sequence_positions`); for t in S let l_t(X) be the logits at t of X with t alone masked
(one masked copy per position, the PLL's copies). Natural log throughout:

    E_raw(X)  = - sum_{t in S} l_t(X)[x_t]                          (raw scores, paper sec. 2.1)
    E_norm(X) = - sum_{t in S} log softmax(l_t(X))[x_t] = -PLL(X)   (locally normalised, sec. 2.2)

the softmax over the whole vocabulary, as in PLL scoring. The energy is of the whole sequence: with a
fixed context (conditional generation: only some positions sampled), S still covers the context's
positions, since every term depends on the sampled tokens through h(X\\t).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM
from .masking import Sentence, build, shape_of
from .packing import Piece, TokenBudget, pack, run_fitting


def sequence_positions(mlm: MaskedLM, input_ids: np.ndarray) -> np.ndarray:
    """Every position except the sequence-level specials (CLS/SEP, BOS/EOS, padding): the positions
    the energy sums over. A mask token counts as an ordinary position (it is there to be filled)."""
    t = mlm.tokenizer
    specials = {t.cls_token_id, t.sep_token_id, t.bos_token_id, t.eos_token_id, t.pad_token_id} - {None}
    return np.array([i for i, token in enumerate(input_ids.tolist()) if token not in specials], dtype=np.int64)


class EnergyEngine:
    """E_raw and E_norm of many sequences, every masked copy of all of them packed under the budget."""

    def __init__(self, mlm: MaskedLM, batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())

    def energies(self, sequences: Sequence[np.ndarray], scored: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(raw, norm): (N,) float64 each, sequence j summed over its positions scored[j]."""
        sentences = [Sentence(ids, positions, np.full(len(ids), -1)) for ids, positions in zip(sequences, scored)]
        raw_terms = [np.empty(len(s.targets)) for s in sentences]
        norm_terms = [np.empty(len(s.targets)) for s in sentences]
        lengths, counts = shape_of(sentences)

        def score(pieces: list[Piece]):
            batch = build(sentences, pieces, "original", self.mlm.mask_token_id, self.mlm.pad_token_id)
            return batch, self._forward(batch)

        for pieces in pack(lengths, counts, self.budget):
            for _, (batch, (raw, norm)) in run_fitting(pieces, lengths, self.budget, score, CUDA_OUT_OF_MEMORY):
                for j in np.unique(batch.sentence):
                    rows = batch.sentence == j
                    raw_terms[j][batch.slot[rows]] = raw[rows]
                    norm_terms[j][batch.slot[rows]] = norm[rows]
        raw_e = np.array([-t.sum() for t in raw_terms], dtype=np.float64)
        norm_e = np.array([-t.sum() for t in norm_terms], dtype=np.float64)
        return raw_e, norm_e

    @torch.inference_mode()
    def _forward(self, batch) -> tuple[np.ndarray, np.ndarray]:
        """(B,) raw logit and log-probability of each row's label at its masked position."""
        labels = torch.as_tensor(batch.labels, device=self.mlm.device)  # (B,)
        raw, norm, start = [], [], 0
        for logits in self.mlm.logits_at(batch.input_ids, batch.attention_mask, batch.positions):  # (c, V)
            logits = logits.double()
            picked = logits.gather(1, labels[start : start + len(logits), None]).squeeze(1)  # (c,)
            raw.append(picked)
            norm.append(picked - torch.logsumexp(logits, dim=-1))
            start += len(logits)
        return torch.cat(raw).cpu().numpy(), torch.cat(norm).cpu().numpy()
