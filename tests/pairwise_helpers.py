"""References for the pairwise conditionals and joints, written independently of the package.

`NaivePairs`: one forward pass per value v, full logits, float64 model and log-softmax; positions are
derived from the tokenizer (`reference.scored_positions`), not from the package's prepare code.
`conditionals_of_joint`: the exact conditionals of a known joint, as the engine would return them.
`minimise_eq4`: a brute-force minimiser of eq. 4 over the simplex, for checking Arnold-Gokhale.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from distributed_scoring.engine.conditionals import PairConditionals
from reference import scored_positions


@dataclass(frozen=True)
class NaiveTables:
    """float64, indexed by token id: [i, j] is a = i, b = j."""

    logits_a: torch.Tensor  # (V, V) raw logits at a (over i) with b = j put in
    logits_b: torch.Tensor  # (V, V) raw logits at b (over j) with a = i put in
    marginal_a: torch.Tensor  # (V,) raw logits at a, both masked
    marginal_b: torch.Tensor  # (V,) raw logits at b, both masked
    gold: tuple[int, int]


class NaivePairs:
    def __init__(self, model, tokenizer) -> None:
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.tokenizer = tokenizer

    def positions(self, text: str, a: int, b: int) -> tuple[list[int], int, int]:
        ids = self.tokenizer(text)["input_ids"]
        scored = scored_positions(self.tokenizer, ids)
        return ids, scored[a], scored[b]

    @torch.no_grad()
    def logits_at(self, ids: list[int], position: int) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0, position].double()  # (V,)

    def tables(self, text: str, a: int, b: int) -> NaiveTables:
        ids, pa, pb = self.positions(text, a, b)
        mask = self.tokenizer.mask_token_id
        vocab = self.model.config.vocab_size
        both = list(ids)
        both[pa] = both[pb] = mask

        def put(position: int, value: int) -> list[int]:
            copy_ids = list(both)
            copy_ids[position] = value
            return copy_ids

        logits_a = torch.stack([self.logits_at(put(pb, v), pa) for v in range(vocab)], dim=1)  # (V_a, V_b)
        logits_b = torch.stack([self.logits_at(put(pa, v), pb) for v in range(vocab)], dim=0)  # (V_a, V_b)
        return NaiveTables(
            logits_a, logits_b, self.logits_at(both, pa), self.logits_at(both, pb), (ids[pa], ids[pb])
        )


def conditionals_of_joint(log_joint: torch.Tensor, gold=(0, 0), mask_id: int = 0) -> PairConditionals:
    """The conditionals an MLM whose unary conditionals are exactly those of `log_joint` would give,
    with the both-masked marginals taken as the joint's marginals."""
    return conditionals_of(
        log_joint - log_joint.logsumexp(0, keepdim=True),
        log_joint - log_joint.logsumexp(1, keepdim=True),
        log_joint.logsumexp(1),
        log_joint.logsumexp(0),
        gold,
        mask_id,
    )


def conditionals_of(log_a_given_b, log_b_given_a, log_a, log_b, gold=(0, 0), mask_id=0) -> PairConditionals:
    """Wrap given log-probability tables (raw logits taken equal to them)."""
    ka, kb = log_a_given_b.shape
    return PairConditionals(
        log_a_given_b=log_a_given_b,
        log_b_given_a=log_b_given_a,
        log_a=log_a,
        log_b=log_b,
        norm_a=torch.zeros(kb, dtype=log_a_given_b.dtype),
        norm_b=torch.zeros(ka, dtype=log_a_given_b.dtype),
        support_a=torch.arange(ka),
        support_b=torch.arange(kb),
        gold=gold,
        mask_id=mask_id,
    )


def eq4_objective(log_joint: torch.Tensor, log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor) -> torch.Tensor:
    """Eq. 4: sum over both positions and every value of the other of KL(q || mu's conditional)."""
    mu_a = log_joint - log_joint.logsumexp(0, keepdim=True)
    mu_b = log_joint - log_joint.logsumexp(1, keepdim=True)
    kl_a = (log_a_given_b.exp() * (log_a_given_b - mu_a)).sum()
    kl_b = (log_b_given_a.exp() * (log_b_given_a - mu_b)).sum()
    return kl_a + kl_b


def minimise_eq4(log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor, starts: int = 8) -> torch.Tensor:
    """Brute force: L-BFGS on softmax-parametrised joints from several random starts; the best log-joint."""
    generator = torch.Generator().manual_seed(0)
    best, best_value = None, float("inf")
    for _ in range(starts):
        theta = torch.randn(log_a_given_b.shape, dtype=torch.float64, generator=generator).requires_grad_()
        optimiser = torch.optim.LBFGS([theta], max_iter=2000, tolerance_grad=1e-14, tolerance_change=1e-16,
                                      line_search_fn="strong_wolfe")

        def closure():
            optimiser.zero_grad()
            value = eq4_objective(theta.flatten().log_softmax(0).view_as(theta), log_a_given_b, log_b_given_a)
            value.backward()
            return value

        optimiser.step(closure)
        with torch.no_grad():
            log_joint = theta.flatten().log_softmax(0).view_as(theta)
            value = eq4_objective(log_joint, log_a_given_b, log_b_given_a).item()
        if value < best_value:
            best, best_value = log_joint, value
    return best


def random_pairs(n_targets: int, rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
    """Distinct (a, b) index pairs, adjacent and reversed ones included."""
    pairs = {(0, 1), (n_targets - 1, 0)} if n_targets > 1 else set()
    while len(pairs) < min(count, n_targets * (n_targets - 1)):
        a, b = rng.choice(n_targets, 2, replace=False)
        pairs.add((int(a), int(b)))
    return sorted(pairs)
