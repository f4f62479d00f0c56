"""Infilling masked spans (Calef et al., HCB beam search): beam search, sampling baselines and exact search.

An example is a token sequence whose positions M = {m_1 < ... < m_k} hold the mask token. A fill writes
one token at each, in a fill order i_1 .. i_k chosen as it goes, and is scored along that order:

    chain(x_M) = sum_s log p(x_{i_s} | c_s)                     (standard beam search)
    hcb(x_M)   = sum_s [log p(x_{i_s} | c_s) - log p(pivot | c_s) at i_s]   (HCB, pivot = the mask token)

where c_s is the example with x_{i_1} .. x_{i_{s-1}} written in and the other positions of M still masked;
both terms come from one softmax over the whole vocabulary (special tokens included), natural log.
HCB's correction makes the score the Hammersley-Clifford-Besag joint log p(x_M) - log p(pivot_M) along
the order, at no extra forward pass. Orders: `l2r` fills m_1, m_2, ...; `best-to-worst` fills, per beam,
the remaining position whose largest log-probability over the whole vocabulary is highest (ties to the
leftmost), from the standard log-probabilities, as the authors' code does; `given` fills in each
example's own order (u-PMLM generation, Liao et al. 2020, Algorithm 1: a random or any other order).
Candidates are the `allowed` tokens (every non-special token by default): special tokens are never filled.

Beam search (`standard`, `hcb`) keeps `beam` partial fills per example: each beam proposes its top `beam`
tokens at its position, and the example keeps the best `beam` of the beam x beam expansions (ties: the
earlier beam, then the smaller token id), which is the best `beam` of all beam x |V| expansions. Two
beams may reach the same fill in different orders (best-to-worst); both are kept, as in the paper's code.
`exact` is the same search without pruning: every fill of the allowed tokens, ranked by the chain score,
with the HCB score of each (the ground truth that shows a decoder's search error). The sampling baselines
(`sample`, `temperature`, `top-k`, `top-p`) use as many forward passes: `beam` distinct tokens at the
first position (without replacement), then one token per chain and step, each chain scored by its
chain log-probability under the unfiltered model; top-p keeps the smallest set of tokens whose
probability reaches p (Holtzman et al., so the token that crosses p is kept; the authors' code drops it).
`filtered` applies all three filters as set, temperature then top-k then top-p (`dscore generate`).

All live beams of all examples of a call go through one packed forward pass per fill step (rows of one
example share its length), under the token budget, with the out-of-memory halving of `packing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch

from .infill_settings import SAMPLERS, InfillSettings
from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM
from .packing import Piece, TokenBudget, pack, run_fitting


@dataclass(frozen=True)
class InfillExample:
    """Token ids with the mask token at `masks` (ascending positions); `seed` drives its sampling;
    `order` is the fill order of the `given` order (the masks' positions, permuted)."""

    input_ids: np.ndarray  # (L,)
    masks: np.ndarray  # (k,)
    seed: int = 0
    order: np.ndarray | None = None  # (k,)


@dataclass(frozen=True)
class Fill:
    """A completed fill: its tokens in position order, both scores, and the order it was filled in."""

    tokens: np.ndarray  # (k,) token ids at masks[0], masks[1], ...
    chain: float
    hcb: float
    order: tuple[int, ...]  # positions, in fill order


@dataclass
class _Beam:
    ids: np.ndarray  # (L,) the example with this beam's tokens written in
    remaining: tuple[int, ...]  # positions still masked, in fill order for `given`, else ascending
    chain: float = 0.0
    hcb: float = 0.0
    order: tuple[int, ...] = field(default=())


@dataclass
class _Step:
    """What one beam's forward pass gives: the position it fills next and its candidates there."""

    position: int
    pivot: float  # log p(pivot | context) at the position
    ids: np.ndarray  # (C,) candidate token ids (top ones for beam search, all allowed for samplers)
    logp: np.ndarray  # (C,) their log-probabilities, float64


def exact_size(n_allowed: int, k: int) -> int:
    """Fills `exact` enumerates: n_allowed ** k."""
    return n_allowed**k


class InfillEngine:
    """Fills examples with one loaded model; results do not depend on the batching."""

    def __init__(self, mlm: MaskedLM, allowed: np.ndarray, batch_tokens: int | None = None) -> None:
        self.mlm = mlm
        self.allowed_ids = np.flatnonzero(allowed)
        self.allowed = torch.as_tensor(allowed, device=mlm.device)  # (V,) bool
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())

    def search(
        self,
        examples: Sequence[InfillExample],
        settings: InfillSettings,
        report: Callable[[int, int], None] | None = None,
    ) -> list[list[Fill]]:
        """Per example, its fills best first: `beam` of them (chains for samplers), every fill for `exact`.
        `report(positions filled, most masks of an example)` is called after each step of the search."""
        width = [
            exact_size(len(self.allowed_ids), len(e.masks)) if settings.decoder == "exact" else settings.beam
            for e in examples
        ]
        beams = [[_Beam(e.input_ids.copy(), _fill_order(e, settings.order))] for e in examples]
        rngs = [np.random.default_rng(e.seed) for e in examples]
        sampler = settings.decoder in SAMPLERS
        pivot = self.mlm.mask_token_id if settings.pivot is None else settings.pivot
        most = max((len(e.masks) for e in examples), default=0)
        filled = 0
        while live := [i for i, b in enumerate(beams) if b[0].remaining]:
            rows = [beam for i in live for beam in beams[i]]
            steps = iter(self._steps(rows, [len(beams[i]) for i in live], settings, pivot))
            for i in live:
                step = [next(steps) for _ in beams[i]]
                if sampler:
                    beams[i] = _sample(beams[i], step, width[i], settings, rngs[i])
                else:
                    beams[i] = _prune(beams[i], step, width[i], settings.decoder == "hcb")
            filled += 1
            if report is not None:
                report(filled, most)
        key = (lambda b: b.hcb) if settings.decoder == "hcb" else (lambda b: b.chain)
        out = []
        for e, final in zip(examples, beams):
            ranked = sorted(final, key=key, reverse=True)  # stable: ties keep the search's order
            out.append([Fill(b.ids[e.masks].copy(), b.chain, b.hcb, b.order) for b in ranked])
        return out

    def _steps(self, rows: list[_Beam], groups: list[int], settings: InfillSettings, pivot: int) -> list[_Step]:
        """One `_Step` per row, in row order; rows come in groups (examples) of equal length."""
        starts = np.cumsum([0, *groups])
        lengths = [len(rows[start].ids) for start in starts[:-1]]
        out: list[_Step | None] = [None] * len(rows)
        forward = partial(self._forward, rows, starts, settings, pivot)
        for pieces in pack(lengths, groups, self.budget):
            for _, steps in run_fitting(pieces, lengths, self.budget, forward, CUDA_OUT_OF_MEMORY):
                for index, step in steps:
                    out[index] = step
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _forward(
        self, rows: list[_Beam], starts: np.ndarray, settings: InfillSettings, pivot: int, pieces: list[Piece]
    ) -> list[tuple[int, _Step]]:
        """The encoder once over the pieces' rows; the head at each row's remaining (or next) positions."""
        index = [int(starts[p.group]) + r for p in pieces for r in range(p.start, p.end)]
        width = len(rows[index[0]].ids)
        input_ids = np.full((len(index), width), self.mlm.pad_token_id, dtype=np.int64)  # (B, T)
        attention = np.zeros((len(index), width), dtype=np.int64)  # (B, T)
        for r, i in enumerate(index):
            input_ids[r, : len(rows[i].ids)] = rows[i].ids
            attention[r, : len(rows[i].ids)] = 1
        best = settings.order == "best-to-worst"
        asked = [rows[i].remaining if best else rows[i].remaining[:1] for i in index]
        row_of = np.repeat(np.arange(len(index)), [len(a) for a in asked])  # (Q,)
        positions = np.array([p for a in asked for p in a], dtype=np.int64)  # (Q,)
        logits = torch.cat(list(self.mlm.logits_at(input_ids, attention, positions, row_of)))  # (Q, V)
        logp = torch.log_softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)  # (Q, V)
        chosen = self._choose(logp, asked)  # (B,) row of logp that each beam fills from
        rows_logp = logp[chosen]  # (B, V)
        pivots = rows_logp[:, pivot].double().cpu().numpy()  # (B,)
        at = positions[chosen.cpu().numpy()]  # (B,)
        if settings.decoder in SAMPLERS:
            ids = torch.as_tensor(self.allowed_ids, device=logp.device)
            values = rows_logp[:, ids].double().cpu().numpy()  # (B, C)
            return [(i, _Step(int(at[r]), float(pivots[r]), self.allowed_ids, values[r])) for r, i in enumerate(index)]
        k = min(len(self.allowed_ids), settings.beam if settings.decoder != "exact" else len(self.allowed_ids))
        masked = rows_logp.masked_fill(~self.allowed, float("-inf"))  # (B, V)
        top_values, top_ids = masked.topk(k, dim=-1)  # (B, k)
        top_values, top_ids = top_values.double().cpu().numpy(), top_ids.cpu().numpy()
        return [(i, _Step(int(at[r]), float(pivots[r]), top_ids[r], top_values[r])) for r, i in enumerate(index)]

    @staticmethod
    def _choose(logp: torch.Tensor, asked: list[tuple[int, ...]]) -> torch.Tensor:
        """(B,) index into logp's rows: each beam's first asked position (l2r), or the one whose largest
        log-probability is highest (best-to-worst; `argmax` takes the first, i.e. leftmost, maximum)."""
        starts = np.cumsum([0, *[len(a) for a in asked]])[:-1]
        if all(len(a) == 1 for a in asked):
            return torch.as_tensor(starts, device=logp.device)
        peaks = logp.max(dim=-1).values.cpu().numpy()  # (Q,)
        picks = [int(s) + int(np.argmax(peaks[s : s + len(a)])) for s, a in zip(starts, asked)]
        return torch.as_tensor(picks, device=logp.device)


def _fill_order(example: InfillExample, order: str) -> tuple[int, ...]:
    """The masks in the order `_forward` takes them first to last: the example's own for `given`."""
    if order != "given":
        return tuple(int(m) for m in example.masks)
    if example.order is None or sorted(example.order.tolist()) != sorted(example.masks.tolist()):
        raise ValueError("the `given` order needs each example's `order`: its masks' positions, permuted")
    return tuple(int(m) for m in example.order)


def _advance(beam: _Beam, position: int, token: int, logp: float, pivot: float) -> _Beam:
    ids = beam.ids.copy()
    ids[position] = token
    remaining = tuple(p for p in beam.remaining if p != position)
    return _Beam(ids, remaining, beam.chain + logp, beam.hcb + logp - pivot, (*beam.order, position))


def _prune(beams: list[_Beam], steps: list[_Step], width: int, hcb: bool) -> list[_Beam]:
    """The best `width` expansions of an example's beams (ties: earlier beam, then smaller token id)."""
    candidates = []
    for b, (beam, step) in enumerate(zip(beams, steps)):
        base = (beam.hcb - step.pivot) if hcb else beam.chain
        for token, logp in zip(step.ids.tolist(), step.logp.tolist()):
            candidates.append((-(base + logp), b, token, logp))
    candidates.sort()
    return [
        _advance(beams[b], steps[b].position, token, logp, steps[b].pivot) for _, b, token, logp in candidates[:width]
    ]


def _sample(
    beams: list[_Beam], steps: list[_Step], width: int, settings: InfillSettings, rng: np.random.Generator
) -> list[_Beam]:
    """Chains advanced by sampling: `width` distinct tokens for the first step, then one per chain."""
    out = []
    for beam, step in zip(beams, steps):
        draws = width if len(beams) == 1 and not beam.order else 1
        weights = _sampling_weights(step.logp, settings)  # (C,) log-weights, -inf where filtered out
        keys = weights + rng.gumbel(size=len(weights))  # Gumbel-top-k: draws without replacement
        support = int(np.isfinite(weights).sum())
        for c in np.argsort(-keys, kind="stable")[: min(draws, support)]:
            out.append(_advance(beam, step.position, int(step.ids[c]), float(step.logp[c]), step.pivot))
    return out


def _sampling_weights(logp: np.ndarray, settings: InfillSettings) -> np.ndarray:
    """Unnormalised log-weights of the candidates under the sampler's filters (`InfillSettings.filters`):
    log p / T, then the top k of them, then the nucleus of that distribution; -inf where filtered out."""
    temperature, top_k, top_p = settings.filters
    weights = logp / temperature
    if top_k:
        weights = _kept(weights, np.argsort(-weights, kind="stable")[:top_k])
    if top_p < 1:
        order = np.argsort(-weights, kind="stable")
        probs = np.exp(weights[order] - np.logaddexp.reduce(weights))
        weights = _kept(weights, order[: int(np.searchsorted(np.cumsum(probs), top_p)) + 1])
    return weights


def _kept(weights: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = np.full_like(weights, -np.inf)
    out[keep] = weights[keep]
    return out
