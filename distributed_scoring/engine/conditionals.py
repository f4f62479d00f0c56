"""The MLM conditionals that pairwise joints are built from (Torroba-Hennigen & Kim, 2023, sec. 2.1).

For one example (a sentence w and two of its tokens a != b) the constructions of `joints` need, over the
vocabulary V:

    q(a | b = v, w_rest)  for every v in V    mask a, put v at b    (|V| forward passes)
    q(b | a = v, w_rest)  for every v in V    mask b, put v at a    (|V| forward passes)
    q(a | w_rest), q(b | w_rest)              mask both             (the MLM construction, eq. 1)

V is every token id of the model, special tokens included, as in the paper's reference code. [MASK] is
one of them, so the input "a masked, b = [MASK]" *is* the both-masked input: the marginals are the
v = [MASK] rows of the unary tables and an example costs 2|V| passes, not 2|V| + 1.

All rows of an example have the example's length and differ from one base (both positions masked) at one
position only, so they are built by one scatter and packed without padding between them; examples are
sorted longest first and packed under a token budget (rows x padded length) by `packing.pack`, an
example's rows running over as many batches as the budget needs. Each row needs the vocabulary
projection at one position only: the encoder runs once per batch, one hidden state per row is gathered,
and the LM head runs on those rows (`MaskedLM.logits_at`), in chunks that bound rows x |V|, in float32
(float64 for a model loaded in float64).

`top_k` restricts each position to a candidate set, an approximation the paper's code also offers: the
gold token, the top k of q(a | b = gold, w_rest) and the top k of q(a | w_rest) (from a first pass of
four rows per example), likewise for b. The tables then cover candidates x candidates and every
distribution is renormalised over the candidates; exact values are the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import UserError
from .masked_lm import CUDA_OUT_OF_MEMORY, MaskedLM
from .packing import Piece, TokenBudget, pack, run_fitting


@dataclass(frozen=True)
class Pair:
    """One example: a tokenised sentence and the two tokens whose joint is wanted.

    `a` and `b` index the non-special tokens (`targets`, as `prepare.Prepared.targets` gives them): k is
    the k-th non-special token. Their order matters only for HCB, whose eq. 3 takes a first.
    """

    input_ids: np.ndarray  # (L,) token ids, special tokens included
    targets: np.ndarray  # (n,) positions of the non-special tokens in input_ids
    a: int
    b: int

    def __post_init__(self) -> None:
        n = len(self.targets)
        if not (0 <= self.a < n and 0 <= self.b < n) or self.a == self.b:
            raise UserError(
                f"token indices a={self.a}, b={self.b} must differ and lie in [0, {n}): the sentence has "
                f"{n} non-special tokens"
            )

    @property
    def positions(self) -> tuple[int, int]:
        """Positions of a and b in input_ids."""
        return int(self.targets[self.a]), int(self.targets[self.b])

    @property
    def gold(self) -> tuple[int, int]:
        """The token ids at a and b in the sentence."""
        pa, pb = self.positions
        return int(self.input_ids[pa]), int(self.input_ids[pb])


@dataclass(frozen=True)
class PairConditionals:
    """The MLM's conditionals for one example, in log space, on the engine's device and head dtype.

    Index i runs over `support_a` (the values of a), j over `support_b`; both are all of V by default.
    Every distribution is normalised over its support. The raw logits, which the summed-logit MRF needs,
    are `logits_a()` and `logits_b()`.
    """

    log_a_given_b: torch.Tensor  # (Ka, Kb) [i, j] = log q(a = i | b = j, rest); logsumexp over dim 0 is 0
    log_b_given_a: torch.Tensor  # (Ka, Kb) [i, j] = log q(b = j | a = i, rest); logsumexp over dim 1 is 0
    log_a: torch.Tensor  # (Ka,) log q(a | rest), both masked
    log_b: torch.Tensor  # (Kb,) log q(b | rest), both masked
    norm_a: torch.Tensor  # (Kb,) logsumexp of the raw logits at a over support_a, for each b = j
    norm_b: torch.Tensor  # (Ka,) logsumexp of the raw logits at b over support_b, for each a = i
    support_a: torch.Tensor  # (Ka,) int64 token ids
    support_b: torch.Tensor  # (Kb,) int64 token ids
    gold: tuple[int, int]  # (i, j) of the sentence's own tokens
    mask_id: int

    def logits_a(self) -> torch.Tensor:
        """(Ka, Kb) raw logits at a (over the support), for each b = j."""
        return self.log_a_given_b + self.norm_a[None, :]

    def logits_b(self) -> torch.Tensor:
        """(Ka, Kb) raw logits at b (over the support), for each a = i."""
        return self.log_b_given_a + self.norm_b[:, None]

    def index_a(self, token_id: int) -> int:
        """Where a token id sits in support_a; an error if the candidate set left it out."""
        return _index(self.support_a, token_id, "a")


def _index(support: torch.Tensor, token_id: int, name: str) -> int:
    hits = (support == token_id).nonzero()
    if len(hits) == 0:
        raise UserError(f"token id {token_id} is not among the {len(support)} candidates of position {name}")
    return int(hits[0, 0])


@dataclass(eq=False)
class _Block:
    """Rows of one example that differ only in the token at `other`: one row per entry of `values`.

    Collects, for each row, the raw logits at `target` over `keep` (all of V when None) into `table`.
    """

    example: int
    target: int  # position read (masked)
    other: int  # position set to each value
    values: np.ndarray  # (R,) token ids put at `other`, one per row
    keep: torch.Tensor | None  # (K,) token ids kept from the logits, on the device
    table: torch.Tensor | None = None  # (R, K)

    def write(self, start: int, logits: torch.Tensor) -> None:
        """Store the logits (n, V) of rows start..start+n."""
        rows = logits if self.keep is None else logits[:, self.keep]  # (n, K)
        if self.table is None:
            self.table = torch.empty((len(self.values), rows.shape[1]), dtype=rows.dtype, device=rows.device)
        self.table[start : start + len(rows)] = rows

    def take(self) -> torch.Tensor:
        """The complete table, released from the block so that it lives no longer than its user needs."""
        table, self.table = self.table, None
        return table


@dataclass(frozen=True)
class _Segment:
    """Rows start..end of one block, consecutive in a batch."""

    block: _Block
    start: int
    end: int


# Peak memory of exact joints, in |V| x |V| tables of the head dtype: the examples in flight, then the
# constructions' temporaries (measured on CPU: 8.1 |V|^2 at V = 3,000, 7.5 at V = 6,000; rounded up).
PEAK_TABLES = 10


class ConditionalsEngine:
    """Computes `PairConditionals` for many examples with one loaded model; batching changes no value.

    Exact tables over the whole vocabulary need about `PEAK_TABLES` |V|^2 values of memory; a device
    without that much free memory is refused before any work, rather than killed half-way.
    """

    def __init__(self, mlm: MaskedLM, batch_tokens: int | None = None, top_k: int | None = None) -> None:
        if top_k is not None and top_k < 1:
            raise UserError(f"top_k must be positive or None (the whole vocabulary), got {top_k}")
        self.mlm = mlm
        self.budget = TokenBudget(batch_tokens or mlm.default_batch_tokens())
        self.top_k = top_k
        self.vocab_size = int(mlm.model.config.vocab_size)
        if top_k is None:
            need = PEAK_TABLES * self.vocab_size**2 * torch.finfo(mlm.head_dtype).bits // 8
            free = free_memory(mlm.device)
            if need > free:
                raise UserError(
                    f"exact pairwise joints over a vocabulary of {self.vocab_size} need about {need / 2**30:.1f} GiB "
                    f"({PEAK_TABLES} |V| x |V| tables), and {mlm.device.type} has {free / 2**30:.1f} GiB free: pass "
                    "--top-k K (the gold tokens and each conditional's top K, an approximation) or use a device "
                    "with more memory"
                )

    def conditionals(self, pairs: Sequence[Pair]) -> Iterator[tuple[int, PairConditionals]]:
        """Yield (index in `pairs`, conditionals) as each example completes (longest sentences first).

        An example's tables are |V| x |V| on the device (3.4 GB in float32 for a 29k vocabulary), so they
        are handed over one by one rather than collected.
        """
        supports = self._supports(pairs)
        blocks = []
        for index, pair in enumerate(pairs):
            (pa, pb), (sa, sb) = pair.positions, supports[index]
            blocks.append(_Block(index, pa, pb, self._with_mask(sb), self._keep(sa)))  # q(a | b = v)
            blocks.append(_Block(index, pb, pa, self._with_mask(sa), self._keep(sb)))  # q(b | a = v)
        for index in self._run(pairs, blocks):
            yield index, self._finish(pairs[index], supports[index], blocks[2 * index], blocks[2 * index + 1])

    def _supports(self, pairs: Sequence[Pair]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Values of a and of b: all of V, or the candidate sets of `top_k`."""
        if self.top_k is None:
            everything = np.arange(self.vocab_size)
            return [(everything, everything)] * len(pairs)
        mask = self.mlm.mask_token_id
        probes = []
        for index, pair in enumerate(pairs):
            (pa, pb), (ga, gb) = pair.positions, pair.gold
            probes.append(_Block(index, pa, pb, np.array([gb, mask]), None))  # q(a | b = gold), q(a | rest)
            probes.append(_Block(index, pb, pa, np.array([ga, mask]), None))  # q(b | a = gold), q(b | rest)
        out: list = [None] * len(pairs)
        for index in self._run(pairs, probes):
            (ga, gb), block_a, block_b = pairs[index].gold, probes[2 * index], probes[2 * index + 1]
            out[index] = (self._candidates(ga, block_a.take()), self._candidates(gb, block_b.take()))
        return out

    def _candidates(self, gold: int, logits: torch.Tensor) -> np.ndarray:
        """Sorted token ids: the gold one and the top k of each row of logits (2, V)."""
        top = logits.topk(min(self.top_k, logits.shape[1]), dim=1).indices.flatten().cpu().numpy()
        return np.unique(np.concatenate([[gold], top]))

    def _with_mask(self, support: np.ndarray) -> np.ndarray:
        """The values to put at the other position: the support, and [MASK] if it is not in it."""
        mask = self.mlm.mask_token_id
        return support if mask in support else np.append(support, mask)

    def _keep(self, support: np.ndarray) -> torch.Tensor | None:
        if len(support) == self.vocab_size:
            return None
        return torch.from_numpy(support).to(self.mlm.device)

    def _finish(
        self, pair: Pair, supports: tuple[np.ndarray, np.ndarray], block_a: _Block, block_b: _Block
    ) -> PairConditionals:
        sa, sb = supports
        mask = self.mlm.mask_token_id
        table_a, table_b = block_a.take(), block_b.take()  # (Rb, Ka) rows b = v, (Ra, Kb) rows a = v
        norm_a = torch.logsumexp(table_a, dim=1)  # (Rb,)
        norm_b = torch.logsumexp(table_b, dim=1)  # (Ra,)
        table_a -= norm_a[:, None]  # log q(a | b = v), normalised over support_a
        table_b -= norm_b[:, None]  # log q(b | a = v), normalised over support_b
        mask_a, mask_b = _position(block_b.values, mask), _position(block_a.values, mask)
        ga, gb = pair.gold
        return PairConditionals(
            log_a_given_b=table_a[: len(sb)].T.contiguous(),
            log_b_given_a=table_b[: len(sa)],
            log_a=table_a[mask_b].clone(),
            log_b=table_b[mask_a].clone(),
            norm_a=norm_a[: len(sb)],
            norm_b=norm_b[: len(sa)],
            support_a=torch.from_numpy(sa).to(table_a.device),
            support_b=torch.from_numpy(sb).to(table_a.device),
            gold=(_position(sa, ga), _position(sb, gb)),
            mask_id=mask,
        )

    def _run(self, pairs: Sequence[Pair], blocks: list[_Block]) -> Iterator[int]:
        """Fill the tables of `blocks` (two per example: a's, then b's); yield each example's index once
        both of its blocks are complete."""
        lengths = [len(pairs[block.example].input_ids) for block in blocks]
        bases = [self._both_masked(pair) for pair in pairs]
        half_done: set[int] = set()
        fill = partial(self._fill, blocks, bases)
        for pieces in pack(lengths, [len(block.values) for block in blocks], self.budget):
            for _, completed in run_fitting(pieces, lengths, self.budget, fill, CUDA_OUT_OF_MEMORY):
                for block in completed:
                    if block.example in half_done:
                        yield block.example
                    half_done.add(block.example)

    def _fill(self, blocks: list[_Block], bases: list[np.ndarray], pieces: list[Piece]) -> list[_Block]:
        """Write the rows of `pieces` (a group is a block) into their blocks' tables; return the blocks
        this completed. Nothing is handed out before the whole batch has run, so a batch that runs out
        of memory half-way is simply written again."""
        segments = [_Segment(blocks[p.group], p.start, p.end) for p in pieces]
        return list(_scatter(segments, self._forward(*_build(segments, bases, self.mlm.pad_token_id))))

    def _both_masked(self, pair: Pair) -> np.ndarray:
        ids = np.array(pair.input_ids, dtype=np.int64)
        ids[list(pair.positions)] = self.mlm.mask_token_id
        return ids

    @torch.inference_mode()
    def _forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, positions: np.ndarray
    ) -> Iterator[torch.Tensor]:
        """Raw logits (n, V) at each row's target position, in chunks of rows; head in `head_dtype`."""
        for logits in self.mlm.logits_at(input_ids, attention_mask, positions):  # (C, V)
            yield self._checked(logits)

    def _checked(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] != self.vocab_size:
            raise UserError(
                f"the model predicts {logits.shape[-1]} tokens but its input vocabulary has {self.vocab_size}: "
                "pairwise joints need the same token set at both positions"
            )
        return logits


def free_memory(device: torch.device) -> int:
    """Bytes free on the device: the GPU's free memory, or the host's available memory (Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _position(ids: np.ndarray, token_id: int) -> int:
    return int(np.flatnonzero(ids == token_id)[0])


def _scatter(segments: list[_Segment], chunks: Iterator[torch.Tensor]) -> Iterator[_Block]:
    """Hand each segment its rows of the batch's logits (chunks in row order); yield each block whose
    last row this wrote (a block's rows are written in order, over one or more batches)."""
    pending = iter(segments)
    segment, offset = next(pending), 0
    for logits in chunks:
        while len(logits):
            take = min(len(logits), segment.end - segment.start - offset)
            segment.block.write(segment.start + offset, logits[:take])
            logits, offset = logits[take:], offset + take
            if segment.start + offset == segment.end:
                if segment.end == len(segment.block.values):
                    yield segment.block
                segment, offset = next(pending, None), 0


def _build(segments: list[_Segment], bases: list[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids (B, T), attention_mask (B, T), positions (B,)): each row its example's both-masked
    base with one value put at the block's other position."""
    n_rows = sum(s.end - s.start for s in segments)
    width = max(len(bases[s.block.example]) for s in segments)
    input_ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    attention = np.zeros((n_rows, width), dtype=np.int64)
    positions = np.empty(n_rows, dtype=np.int64)
    row = 0
    for s in segments:
        base, n = bases[s.block.example], s.end - s.start
        input_ids[row : row + n, : len(base)] = base
        input_ids[row : row + n, s.block.other] = s.block.values[s.start : s.end]
        attention[row : row + n, : len(base)] = 1
        positions[row : row + n] = s.block.target
        row += n
    return input_ids, attention, positions
