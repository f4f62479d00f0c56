"""Metropolis-Hastings sampling from a masked LM's energy (Goyal, Dyer & Berg-Kirkpatrick, 2022).

Energies. E(X) is E_raw or E_norm of `energy` (raw scores, paper sec. 2.1; locally normalised, -PLL,
sec. 2.2), of the whole sequence (see `energy`). The target is p(X) ∝ exp(-E(X) / T) over the
sequences that agree with the start outside the sampled positions and hold an `allowed` token at each
sampled one.

Proposals. A move resamples a block B of sampled positions (|B| = 1 for `mh`). One forward pass of X
with all of B masked gives logits l_i at each i in B; the proposal at i is shaped over the allowed
tokens C only (special tokens are never proposed):

    q_i(w) = softmax_{w in C}(l_i[w] / tau)                 (proposal temperature tau)
    top-p: keep the smallest set of the most probable w whose q_i reaches p (the token that crosses p
           is kept), q_i renormalised over it, 0 elsewhere

and the block is proposed independently per position: q(X'|X) = prod_{i in B} q_i(x'_i). The reverse
move masks the same block of X', whose unmasked rest is X's, so the same forward pass gives
q(X|X') = prod_{i in B} q_i(x_i) (zero when x_i is outside the shaped support: such a move is never
accepted, which keeps detailed balance; so with top-p a state whose tokens lie outside the nuclei
can never be left: start such chains `warm` or `given`). Factors of unchanged positions cancel, so
this is the paper's product over the positions that differ. `mh` and `block-mh` accept with probability

    a(X'; X) = min(1, exp(-(E(X') - E(X)) / T) * q(X|X') / q(X'|X))

computed in log space; a proposal equal to X is accepted at once (a = 1) without computing an energy.
`gibbs` (the paper's degenerate Gibbs sampler, block Gibbs for |B| > 1) always accepts: it targets p
only if the MLM conditionals are those of p, which they in general are not.

Every block kernel leaves p invariant (detailed balance), so any sequence of them does: an epoch takes
the sampled positions in ascending order (`sweep`) or a fresh seeded permutation (`random`) and cuts
them into consecutive blocks of the epoch's block size. The target temperature of epoch e (1-based,
burn-in included) is max(min_target_temperature, T - anneal * (e - 1)); the block size is
max(1, block - block_decay * (e - 1)). With `forced_accept` = k, every proposal of the first k epochs
is accepted (the paper's variance trick after a warm start, its appendix: chains warm-started alike
then follow similar trajectories); those epochs are Gibbs moves, not MH ones, so they belong in the
burn-in, and regular MH acceptance resumes after them.

Batching. All chains advance in lockstep: one packed forward pass per step for the proposals of all
chains, one for the masked copies of every proposal whose energy is not known, under the token
budget with the out-of-memory halving of `packing`. Known energies are never recomputed: the current
state's energy is kept, an accepted proposal's becomes the current one, and energies this `Sampler`
already computed are looked up in a bounded LRU cache keyed by the sequence; identical rows of a pass
(chains in the same state) run once. Each chain draws from its own
numpy Generator (seeded by `Chain.seed`) in a fixed order (start, epoch permutation, per step the
proposal uniforms and the acceptance uniform), so results do not depend on the batching.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import numpy as np
import torch

from .energy import EnergyEngine
from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM
from .packing import Piece, TokenBudget, pack, run_fitting
from .sampler_settings import ENERGIES, SamplerSettings

R = TypeVar("R")


@dataclass(frozen=True)
class Chain:
    """One Markov chain: its start, the positions it resamples, the positions its energy sums over."""

    input_ids: np.ndarray  # (L,) the start (`given`), or the fixed context around `sample`
    sample: np.ndarray  # (k,) positions to resample, each in `scored`
    scored: np.ndarray  # (n,) positions the energy sums over (see `energy.sequence_positions`)
    seed: int = 0


@dataclass(frozen=True)
class Record:
    """A chain's state at the end of a recorded epoch, with its counts since the previous record (or
    the start: burn-in included). `novel` counts accepted proposals that changed the sequence."""

    epoch: int  # 1-based, burn-in included
    ids: np.ndarray  # (L,)
    energy_raw: float
    energy_norm: float
    target_temperature: float
    proposals: int
    accepted: int
    novel: int


@dataclass(frozen=True)
class Step:
    """One proposal, as handed to `Sampler.run`'s `trace` (for diagnostics and tests).

    Energies are (raw, norm); for `gibbs` they and the acceptance are not computed (NaN, accepted).
    """

    chain: int
    epoch: int
    block: tuple[int, ...]
    current: np.ndarray  # (L,)
    proposed: np.ndarray  # (L,)
    log_q_forward: float  # log q(X'|X)
    log_q_reverse: float  # log q(X|X')
    energy_current: tuple[float, float]
    energy_proposed: tuple[float, float]
    target_temperature: float
    log_acceptance: float  # log a(X'; X) <= 0
    accepted: bool


def shaped_log_proposal(
    logits: torch.Tensor, allowed_ids: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """(Q, C) float64 log q over the allowed tokens from (Q, V) logits: softmax(l / tau) restricted to
    C, then the top-p nucleus (ties kept in token order), renormalised; -inf outside the nucleus."""
    z = logits[:, allowed_ids].double() / temperature  # (Q, C)
    logq = torch.log_softmax(z, dim=-1)
    if top_p >= 1:
        return logq
    probs, order = logq.exp().sort(dim=-1, descending=True, stable=True)  # (Q, C)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the more probable tokens
    before[:, 0] = 0.0
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)  # (Q, C)
    return torch.log_softmax(z.masked_fill(drop, float("-inf")), dim=-1)


@dataclass
class _State:
    chain: Chain
    rng: np.random.Generator
    ids: np.ndarray  # (L,)
    energy: tuple[float, float] | None = None  # (raw, norm) of ids; None until needed (gibbs)
    proposals: int = 0
    accepted: int = 0
    novel: int = 0

    def recorded(self, epoch: int, temperature: float) -> Record:
        """The state as a record of `epoch` (its energy known), its counts then started again."""
        raw, norm = self.energy  # type: ignore[misc]
        record = Record(epoch, self.ids.copy(), raw, norm, temperature, self.proposals, self.accepted, self.novel)
        self.proposals = self.accepted = self.novel = 0
        return record

    def settle(self, new: np.ndarray, changed: bool, energy: tuple[float, float] | None, accept: bool) -> None:
        """Count a proposal, and move to it (`new`, of `energy`) where it was accepted and changed the
        sequence."""
        self.proposals += 1
        self.accepted += accept
        if accept and changed:
            self.novel += 1
            self.ids = new
            self.energy = energy  # None for gibbs: computed when a record needs it


class Sampler:
    """Runs chains with one loaded model; results do not depend on the batching.

    `allowed` (V,) bool marks the tokens that may be proposed (special tokens must be excluded by the
    caller, as for infilling). `cache_states` bounds the energies kept for lookup (0: none).
    """

    def __init__(
        self, mlm: MaskedLM, allowed: np.ndarray, batch_tokens: int | None = None, cache_states: int = 1 << 16
    ) -> None:
        self.mlm = mlm
        self.allowed = np.asarray(allowed, dtype=bool)
        self.allowed_ids = np.flatnonzero(self.allowed)
        if not len(self.allowed_ids):
            raise ValueError("no allowed token to propose")
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())
        self.energy_engine = EnergyEngine(mlm)
        self.energy_engine.budget = self.budget  # one budget: an out-of-memory halving applies to both
        self.cache_states = cache_states
        self._cache: OrderedDict[tuple[bytes, bytes], tuple[float, float]] = OrderedDict()
        self._index = np.full(len(self.allowed), -1, dtype=np.int64)  # token id -> column in C, -1 if not allowed
        self._index[self.allowed_ids] = np.arange(len(self.allowed_ids))

    @property
    def batch_tokens(self) -> int:
        """The current token budget: the one given, halved after each batch that ran out of memory."""
        return self.budget.tokens

    def run(
        self,
        chains: Sequence[Chain],
        settings: SamplerSettings,
        trace: Callable[[Step], None] | None = None,
        report: Callable[[int, int], None] | None = None,
    ) -> list[list[Record]]:
        """Per chain, its records in epoch order. `report(steps done, in all)` is called after each step
        (one proposal per chain), counted in the current epoch's steps."""
        states = [self._state(c, settings) for c in chains]
        self._start(states, settings)
        records: list[list[Record]] = [[] for _ in chains]
        last = settings.burn_in + settings.epochs
        for epoch in range(1, last + 1):
            temperature = settings.target_temperature_at(epoch)
            size = settings.block_at(epoch)
            blocks = [self._blocks(s, size, settings.order) for s in states]
            accept_all = settings.sampler == "gibbs" or epoch <= settings.forced_accept
            if not accept_all:
                self._know_energies(states)
            steps = max((len(b) for b in blocks), default=0)
            for step in range(steps):
                active = [(c, blocks[c][step]) for c in range(len(states)) if step < len(blocks[c])]
                self._step(states, active, settings, temperature, epoch, accept_all, trace)
                if report is not None:
                    report((epoch - 1) * steps + step + 1, last * steps)
            after = epoch - settings.burn_in
            if after > 0 and (after % settings.record_every == 0 or epoch == last):
                self._know_energies(states)
                for state, out in zip(states, records):
                    out.append(state.recorded(epoch, temperature))
        return records

    def energies(self, sequences: Sequence[np.ndarray], scored: Sequence[np.ndarray]) -> list[tuple[float, float]]:
        """(E_raw, E_norm) of each sequence, from the cache where known, the rest in one packed pass."""
        keys = [_key(ids, positions) for ids, positions in zip(sequences, scored)]
        missing: dict[tuple[bytes, bytes], int] = {}
        for j, key in enumerate(keys):
            if key not in self._cache and key not in missing:
                missing[key] = j
        if missing:
            rows = list(missing.values())
            raw, norm = self.energy_engine.energies([sequences[j] for j in rows], [scored[j] for j in rows])
            for key, r, n in zip(missing, raw.tolist(), norm.tolist()):
                self._cache[key] = (r, n)
        out = []
        for key in keys:
            out.append(self._cache[key])
            self._cache.move_to_end(key)
        while len(self._cache) > self.cache_states:
            self._cache.popitem(last=False)
        return out

    # --- the chains ----------------------------------------------------------------------------------

    def _state(self, chain: Chain, settings: SamplerSettings) -> _State:
        chain = Chain(
            np.array(chain.input_ids, dtype=np.int64),
            np.asarray(chain.sample, dtype=np.int64),
            np.asarray(chain.scored, dtype=np.int64),
            chain.seed,
        )
        sample = chain.sample
        if len(np.unique(sample)) != len(sample) or not np.isin(sample, chain.scored).all():
            raise ValueError("a chain's sampled positions must be distinct and among its scored positions")
        if settings.start == "given" and not self.allowed[chain.input_ids[sample]].all():
            raise ValueError(
                "a `given` start must hold allowed tokens at the sampled positions "
                "(start masked inputs `random` or `warm`)"
            )
        return _State(chain, np.random.default_rng(chain.seed), chain.input_ids.copy())

    def _start(self, states: list[_State], settings: SamplerSettings) -> None:
        if settings.start == "random":
            for s in states:
                draws = s.rng.integers(len(self.allowed_ids), size=len(s.chain.sample))
                s.ids[s.chain.sample] = self.allowed_ids[draws]
        elif settings.start == "warm":  # the paper's warm start: every sampled position masked, greedy fill
            mask_id = self.mlm.mask_token_id
            masked = [_masked(s.ids, s.chain.sample, mask_id) for s in states]
            allowed = torch.as_tensor(self.allowed_ids, device=self.mlm.device)

            def greedy(logits: torch.Tensor, rows: list[int]) -> list[np.ndarray]:
                best = allowed[logits[:, allowed].argmax(dim=-1)].cpu().numpy()  # (Q,)
                return list(np.split(best, np.cumsum([len(states[r].chain.sample) for r in rows])[:-1]))

            for s, tokens in zip(states, self._at_positions(masked, [s.chain.sample for s in states], greedy)):
                s.ids[s.chain.sample] = tokens

    def _know_energies(self, states: list[_State]) -> None:
        todo = [s for s in states if s.energy is None]
        if todo:
            for s, e in zip(todo, self.energies([s.ids for s in todo], [s.chain.scored for s in todo])):
                s.energy = e

    @staticmethod
    def _blocks(state: _State, size: int, order: str) -> list[np.ndarray]:
        positions = np.sort(state.chain.sample)
        if order == "random":
            positions = state.rng.permutation(positions)
        return [np.sort(positions[i : i + size]) for i in range(0, len(positions), size)]

    def _step(
        self,
        states: list[_State],
        active: list[tuple[int, np.ndarray]],
        settings: SamplerSettings,
        temperature: float,
        epoch: int,
        gibbs: bool,
        trace: Callable[[Step], None] | None,
    ) -> None:
        """One proposal per active chain; `gibbs`: accept them all (the sampler, or a forced epoch)."""
        draws = [states[c].rng.random(len(block) + (0 if gibbs else 1)) for c, block in active]
        proposed = self._propose(
            [states[c].ids for c, _ in active],
            [b for _, b in active],
            [d[: len(b)] for d, (_, b) in zip(draws, active)],
            settings,
        )
        news, changed, energies = self._proposals(states, active, [tokens for tokens, _, _ in proposed], gibbs)
        which = ENERGIES.index(settings.energy)
        for j, ((c, block), (_, log_fwd, log_rev)) in enumerate(zip(active, proposed)):
            state = states[c]
            if gibbs:
                log_a, accept = 0.0, True
            elif not changed[j]:
                log_a, accept, energies[j] = 0.0, True, state.energy
            else:
                delta = energies[j][which] - state.energy[which]  # type: ignore[index]
                log_a = min(0.0, -delta / temperature + log_rev - log_fwd)
                accept = bool(draws[j][-1] < math.exp(log_a))
            if trace is not None:
                nan = (math.nan, math.nan)
                trace(
                    Step(
                        c,
                        epoch,
                        tuple(block.tolist()),
                        state.ids.copy(),
                        news[j].copy(),
                        log_fwd,
                        log_rev,
                        state.energy or nan,
                        energies[j] or nan,
                        temperature,
                        log_a,
                        accept,
                    )
                )
            state.settle(news[j], changed[j], energies[j], accept)

    def _proposals(
        self, states: list[_State], active: list[tuple[int, np.ndarray]], tokens: list[np.ndarray], gibbs: bool
    ) -> tuple[list[np.ndarray], list[bool], list[tuple[float, float] | None]]:
        """Per active chain: its proposal (its state with `tokens` at its block), whether that differs from
        the state, and the proposal's energy, computed only where it differs and `gibbs` is off (None
        elsewhere: an unchanged proposal is accepted at once, a Gibbs move needs none)."""
        news, changed = [], []
        for (c, block), drawn in zip(active, tokens):
            new = states[c].ids.copy()
            changed.append(bool((new[block] != drawn).any()))
            new[block] = drawn
            news.append(new)
        energies: list[tuple[float, float] | None] = [None] * len(active)
        if not gibbs:
            wanted = [j for j, ch in enumerate(changed) if ch]
            scored = [states[active[j][0]].chain.scored for j in wanted]
            for j, e in zip(wanted, self.energies([news[j] for j in wanted], scored)):
                energies[j] = e
        return news, changed, energies

    def _propose(
        self,
        sequences: list[np.ndarray],
        blocks: list[np.ndarray],
        uniforms: list[np.ndarray],
        settings: SamplerSettings,
    ) -> list[tuple[np.ndarray, float, float]]:
        """Per row (tokens drawn at its block, log q(X'|X), log q(X|X')), from one forward pass of each
        sequence with its block masked; token i of a block is the inverse CDF of its shaped proposal
        at uniforms[i]."""
        device = self.mlm.device
        allowed = torch.as_tensor(self.allowed_ids, device=device)
        mask_id = self.mlm.mask_token_id
        masked = [_masked(ids, block, mask_id) for ids, block in zip(sequences, blocks)]

        def draw(logits: torch.Tensor, rows: list[int]) -> list[tuple[np.ndarray, float, float]]:
            logq = shaped_log_proposal(logits, allowed, settings.proposal_temperature, settings.top_p)  # (Q, C)
            u = torch.as_tensor(np.concatenate([uniforms[r] for r in rows]), device=device)  # (Q,)
            cdf = logq.exp().cumsum(dim=-1)  # (Q, C)
            pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[1] - 1)  # (Q, 1)
            current = np.concatenate([self._index[sequences[r][blocks[r]]] for r in rows])  # (Q,) -1: not allowed
            back = torch.as_tensor(np.maximum(current, 0), device=device)[:, None]  # (Q, 1)
            log_fwd = logq.gather(1, pick).squeeze(1).cpu().numpy()  # (Q,)
            log_rev = logq.gather(1, back).squeeze(1).cpu().numpy()  # (Q,)
            log_rev[current < 0] = -np.inf
            tokens = self.allowed_ids[pick.squeeze(1).cpu().numpy()]  # (Q,)
            sizes = np.array([len(blocks[r]) for r in rows])
            starts = np.cumsum(sizes) - sizes
            fwd, rev = np.add.reduceat(log_fwd, starts).tolist(), np.add.reduceat(log_rev, starts).tolist()  # (B,)
            return [(tokens[a : a + n], f, b) for a, n, f, b in zip(starts.tolist(), sizes.tolist(), fwd, rev)]

        return self._at_positions(masked, blocks, draw)

    def _at_positions(
        self,
        sequences: list[np.ndarray],
        positions: list[np.ndarray],
        head: Callable[[torch.Tensor, list[int]], list[R]],
    ) -> list[R]:
        """head(logits, rows) for packed batches of sequences: logits (Q, V) at positions[r] of each
        row r of the batch, concatenated in row order; head returns one result per row.

        Rows of one length form one packing group; identical rows (chains in the same state) run once.
        """
        by_length: dict[int, list[int]] = {}
        for r, ids in enumerate(sequences):
            by_length.setdefault(len(ids), []).append(r)
        groups = list(by_length.values())
        lengths = [len(sequences[g[0]]) for g in groups]
        keys = [_key(ids, at) for ids, at in zip(sequences, positions)]
        out: list[R | None] = [None] * len(sequences)

        @torch.inference_mode()
        def forward(pieces: list[Piece]) -> tuple[list[int], list[R]]:
            rows = [r for p in pieces for r in groups[p.group][p.start : p.end]]
            first: dict[tuple[bytes, bytes], int] = {}  # key -> its row among the unique ones
            unique: list[int] = []
            for r in rows:
                if keys[r] not in first:
                    first[keys[r]] = len(unique)
                    unique.append(r)
            width = len(sequences[rows[0]])
            input_ids = np.full((len(unique), width), self.mlm.pad_token_id, dtype=np.int64)  # (U, T)
            attention = np.zeros((len(unique), width), dtype=np.int64)  # (U, T)
            for b, r in enumerate(unique):
                input_ids[b, : len(sequences[r])] = sequences[r]
                attention[b, : len(sequences[r])] = 1
            counts = np.array([len(positions[r]) for r in unique])
            row_of = np.repeat(np.arange(len(unique)), counts)  # (Q_u,)
            at = np.concatenate([positions[r] for r in unique]).astype(np.int64)  # (Q_u,)
            logits = torch.cat(list(self.mlm.logits_at(input_ids, attention, at, row_of)))  # (Q_u, V)
            starts = np.cumsum(counts) - counts
            spread = np.concatenate([starts[first[keys[r]]] + np.arange(len(positions[r])) for r in rows])  # (Q,)
            return rows, head(logits[torch.as_tensor(spread, device=logits.device)], rows)

        for pieces in pack(lengths, [len(g) for g in groups], self.budget):
            for _, (rows, results) in run_fitting(pieces, lengths, self.budget, forward, CUDA_OUT_OF_MEMORY):
                for r, result in zip(rows, results):
                    out[r] = result
        return out  # type: ignore[return-value]


def _masked(ids: np.ndarray, positions: np.ndarray, mask_id: int) -> np.ndarray:
    out = ids.copy()
    out[positions] = mask_id
    return out


def _key(ids: np.ndarray, scored: np.ndarray) -> tuple[bytes, bytes]:
    return np.asarray(ids, dtype=np.int64).tobytes(), np.asarray(scored, dtype=np.int64).tobytes()
