"""Known cases for the pairwise conditionals and joints (their naive references are in reference.py).

`conditionals_of_joint`: the exact conditionals of a known joint, as the engine would return them.
`conditionals_of`: given log-probability tables wrapped as the engine's `PairConditionals`.
"""

from __future__ import annotations

import torch

from distributed_scoring.engine.conditionals import PairConditionals


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
