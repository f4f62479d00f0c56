"""Site tables for variant effects (Meier et al., 2021): at chosen positions of a sequence, the log-probability
of every token of an alphabet, read from the sequence with that position masked (`masked`: the masked
marginal, one masked copy per position) or from the sequence as it is (`unmasked`: the wild-type and mutant
marginals, one pass per sequence).

A variant's marginal score is then a sum over its sites of table[site, mutant] - table[site, wild type],
done by the caller from the tables: a wild type's table is computed once, whatever the number of its
variants. The masked copies go through the PLL engine's packed passes (`PLLEngine.token_table`); the
unmasked sequences are packed the same way, one row each. `passes` counts the sequences run through the
model (a batch of 32 copies is 32 passes), `batches` the model calls.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM, OnDevice
from .masking import Sentence
from .packing import Piece, pack, run_fitting
from .pll import PLLEngine


class SiteEngine:
    """Log-probabilities of an alphabet's tokens at each target of each sentence, with the target masked or not."""

    def __init__(self, mlm: MaskedLM, batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.pll = PLLEngine(mlm, "original", batch_tokens)
        self._unmasked_passes = 0
        self._unmasked_batches = 0

    @property
    def passes(self) -> int:
        """Sequences run through the model so far, masked copies and unmasked sequences alike."""
        return self.pll.passes + self._unmasked_passes

    @property
    def batches(self) -> int:
        """Model calls so far."""
        return self.pll.batches + self._unmasked_batches

    def masked(
        self, sentences: Sequence[Sentence], ids: np.ndarray, report: Callable[[int, int], None] | None = None
    ) -> list[np.ndarray]:
        """(n targets, len(ids)) float64 per sentence: log p(ids[j] at t | the sentence with t masked)."""
        return self.pll.token_table(sentences, ids, report)

    def unmasked(
        self, sentences: Sequence[Sentence], ids: np.ndarray, report: Callable[[int, int], None] | None = None
    ) -> list[np.ndarray]:
        """(n targets, len(ids)) float64 per sentence: log p(ids[j] at t | the sentence unmasked), one pass each."""
        vocab = torch.as_tensor(ids, dtype=torch.long)
        lengths = [len(s.input_ids) for s in sentences]
        counts = [1 if len(s.targets) else 0 for s in sentences]  # a sentence with no target needs no pass
        total, done = int(np.dot(lengths, counts)), 0
        order: list[int] = []  # the sentences in the order their tables were kept
        values = OnDevice()

        def score(pieces: list[Piece]) -> torch.Tensor:
            group = [sentences[p.group] for p in pieces]
            width = len(group[0].input_ids)
            input_ids = np.full((len(group), width), self.mlm.pad_token_id, dtype=np.int64)
            attention = np.zeros((len(group), width), dtype=np.int64)
            for row, s in enumerate(group):
                input_ids[row, : len(s.input_ids)] = s.input_ids
                attention[row, : len(s.input_ids)] = 1
            rows = np.concatenate([np.full(len(s.targets), row) for row, s in enumerate(group)]).astype(np.int64)
            positions = np.concatenate([s.targets for s in group]).astype(np.int64)
            tables = []
            with torch.inference_mode():
                for logits in self.mlm.logits_at(input_ids, attention, positions, rows):  # (C, V)
                    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
                    tables.append(logp[:, vocab.to(logp.device)])  # (C, A)
            return torch.cat(tables)

        for pieces in pack(lengths, counts, self.pll.budget):
            for part, table in run_fitting(pieces, lengths, self.pll.budget, score, CUDA_OUT_OF_MEMORY):
                self._unmasked_passes += len(part)
                self._unmasked_batches += 1
                order += [piece.group for piece in part]
                values.add(table)
                done += sum(lengths[p.group] for p in part)
                if report is not None:
                    report(done, total)
        out = [np.empty((len(s.targets), len(ids)), dtype=np.float64) for s in sentences]
        tables = values.host()
        for index, table in zip(order, np.split(tables, np.cumsum([len(sentences[i].targets) for i in order])[:-1])):
            out[index][:] = table
        return out
