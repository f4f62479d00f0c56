"""Joint distributions over two tokens built from MLM conditionals, and the metrics that compare them.

Torroba-Hennigen & Kim (2023), "Deriving language models from masked language models": given the
conditionals of one example (`conditionals.PairConditionals`), five joints q'(w_a, w_b | rest) over
support_a x support_b (all of V x V unless a candidate set was asked for):

    MLM     eq. 1   product of the both-masked marginals q(a | rest) q(b | rest)
    MRF     eq. 2   proportional to q(a | b, rest) q(b | a, rest)
    MRF-L   sec. 2  proportional to exp(logit_a + logit_b): the sum of the raw (pre-softmax) logits of the
                    two unary passes as log potential, as the paper's code does (`normalize_logits=False`)
    HCB     eq. 3   Hammersley-Clifford-Besag from a pivot; recovers the joint when the conditionals are
                    compatible, whatever the pivot
    AG      eq. 5   Arnold-Gokhale iterations (app. C) towards the joint whose conditionals are closest
                    to the MLM's (eq. 4), from uniform

Everything is in log space and normalised with logsumexp, so a |V| x |V| joint in float32 neither
underflows nor overflows. Metrics follow sec. 3, natural log: per example the log-probability of the
gold pair (P-PPL), the gold tokens' unary log-probabilities under the joint's conditionals (U-PPL; the
MLM construction uses the MLM's own unary conditionals), and the KL from the MLM's unary conditionals to
the joint's, averaged over every conditioning value (A-KL) or at the gold one (G-KL). The options, the
metrics and their sums over examples are plain Python, in `joint_stats.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import UserError
from .conditionals import PairConditionals
from .joint_stats import CONSTRUCTIONS, JointOptions, PairMetrics


@dataclass(frozen=True)
class Joint:
    """A joint over support_a x support_b; `change` (AG only) is the total variation distance between its
    last two iterates, which says whether the iterations converged."""

    log_prob: torch.Tensor  # (Ka, Kb), logsumexp over all entries is 0
    change: float | None = None


def normalise(log_potential: torch.Tensor) -> torch.Tensor:
    """(Ka, Kb) log potentials -> log probabilities summing to one over all pairs."""
    return log_potential - torch.logsumexp(log_potential, dim=(0, 1))


def mlm_joint(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Eq. 1: q(a | rest) q(b | rest), the both-masked marginals taken as independent."""
    return log_a[:, None] + log_b[None, :]  # (Ka, Kb), already normalised


def mrf_joint(log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor) -> torch.Tensor:
    """Eq. 2: q'(a, b) proportional to q(a | b, rest) q(b | a, rest). With `logits_a()`/`logits_b()` as
    inputs this is MRF-L, whose log potential is the sum of the unary logits."""
    return normalise(log_a_given_b + log_b_given_a)


def hcb_joint(log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor, pivot: int) -> torch.Tensor:
    """Eq. 3 with S = (a, b) and pivot w' = (pivot, w'_b), `pivot` indexing the values of a:

        q'(w_a, w_b) ~ q(w_a | w_b) / q(w'_a | w_b)  *  q(w_b | w'_a) / q(w'_b | w'_a)

    The last denominator does not depend on (w_a, w_b), so w'_b drops out with the normalisation.
    """
    first = log_a_given_b - log_a_given_b[pivot][None, :]  # (Ka, Kb) log q(w_a | w_b) / q(w'_a | w_b)
    second = log_b_given_a[pivot][None, :]  # (1, Kb) log q(w_b | w'_a)
    return normalise(first + second)


def ag_joint(log_a_given_b: torch.Tensor, log_b_given_a: torch.Tensor, iterations: int = 50) -> Joint:
    """App. C, eq. 5, from the uniform joint, in log space:

        q'(t+1)(w_a, w_b) ~ (q(w_a | w_b) + q(w_b | w_a)) / (1 / q'(t)(w_a) + 1 / q'(t)(w_b))

    Its fixed points are the stationary points of eq. 4 (the KL sum is stationary exactly where this
    ratio holds), so when the conditionals are compatible the true joint is one. Eq. 5 is a
    proportionality and a common scale of both marginals cancels in it, so the iterates are normalised
    once, at the end (a full logsumexp per iteration would nearly double the cost).
    """
    ka, kb = log_a_given_b.shape
    numerator = torch.logaddexp(log_a_given_b, log_b_given_a)  # (Ka, Kb) log(q(a | b) + q(b | a))
    log_joint = torch.full_like(numerator, -math.log(ka * kb))
    previous = log_joint
    for _ in range(iterations):
        previous = log_joint
        inverse_a = -torch.logsumexp(log_joint, dim=1)  # (Ka,) log 1 / q'(w_a), up to the common scale
        inverse_b = -torch.logsumexp(log_joint, dim=0)  # (Kb,) log 1 / q'(w_b)
        log_joint = numerator - torch.logaddexp(inverse_a[:, None], inverse_b[None, :])
    log_joint, previous = normalise(log_joint), normalise(previous)
    change = 0.5 * (log_joint.exp() - previous.exp()).abs().sum()
    return Joint(log_joint, float(change))


def pivot_index(cond: PairConditionals, pivot: str | int) -> int:
    """The index in support_a of HCB's pivot value of a (see `JointOptions`)."""
    if pivot == "mode":
        return int(cond.log_a.argmax())
    if pivot == "unary":
        return int(cond.log_a_given_b[:, cond.gold[1]].argmax())
    if pivot == "gold":
        return cond.gold[0]
    return cond.index_a(cond.mask_id if pivot == "mask" else pivot)


def construct(cond: PairConditionals, name: str, options: JointOptions = JointOptions()) -> Joint:
    """The joint `name` (one of CONSTRUCTIONS) of one example."""
    if name == "MLM":
        return Joint(mlm_joint(cond.log_a, cond.log_b))
    if name == "MRF":
        return Joint(mrf_joint(cond.log_a_given_b, cond.log_b_given_a))
    if name == "MRF-L":
        return Joint(mrf_joint(cond.logits_a(), cond.logits_b()))
    if name == "HCB":
        return Joint(hcb_joint(cond.log_a_given_b, cond.log_b_given_a, pivot_index(cond, options.pivot)))
    if name == "AG":
        return ag_joint(cond.log_a_given_b, cond.log_b_given_a, options.ag_iterations)
    raise UserError(f"joint construction {name!r} is not one of {CONSTRUCTIONS}")


def conditional_kls(cond: PairConditionals, log_joint: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sec. 3's D for every conditioning value: (D(S, w'_b) for each w'_b (Kb,), D(S_r, w'_a) (Ka,)).

    D(S, v) = KL(q(a | b = v, rest) || q'(a | b = v)) with q'(a | b = v) = q'(a, v) - logsumexp_a q'(a, v),
    expanded as sum_a q (log q - q'(a, v)) + logsumexp_a q'(a, v) so the joint's conditionals are never
    materialised (one |V| x |V| buffer less).
    """
    kl_a = _kl(cond.log_a_given_b, log_joint, dim=0)  # (Kb,)
    kl_b = _kl(cond.log_b_given_a, log_joint, dim=1)  # (Ka,)
    return kl_a, kl_b


def _kl(log_p: torch.Tensor, log_joint: torch.Tensor, dim: int) -> torch.Tensor:
    cross = (log_p - log_joint).mul_(log_p.exp()).sum(dim)  # sum p (log p - log q'(joint))
    return cross + torch.logsumexp(log_joint, dim=dim)


def pair_metrics(cond: PairConditionals, log_joint: torch.Tensor, own_unary: bool = False) -> PairMetrics:
    """The metrics of one joint; `own_unary` takes the unary log-probabilities from the MLM's conditionals
    (the MLM construction, whose joint's conditionals are just its marginals)."""
    ga, gb = cond.gold
    kl_a, kl_b = conditional_kls(cond, log_joint)
    if own_unary:
        unary_a, unary_b = cond.log_a_given_b[ga, gb], cond.log_b_given_a[ga, gb]
    else:
        unary_a = log_joint[ga, gb] - torch.logsumexp(log_joint[:, gb], dim=0)  # log q'(w_a | w_b)
        unary_b = log_joint[ga, gb] - torch.logsumexp(log_joint[ga, :], dim=0)  # log q'(w_b | w_a)
    values = torch.stack(
        [log_joint[ga, gb], unary_a, unary_b, (kl_a.mean() + kl_b.mean()) / 2, (kl_a[gb] + kl_b[ga]) / 2]
    )
    return PairMetrics(*values.double().tolist())


@dataclass(frozen=True)
class PairScores:
    """All constructions' metrics for one example, and AG's last change (its convergence check)."""

    metrics: dict[str, PairMetrics]
    ag_change: float


def score_pair(cond: PairConditionals, options: JointOptions = JointOptions()) -> PairScores:
    """Build each joint in turn and keep only its metrics, so at most one |V| x |V| joint is alive."""
    metrics, change = {}, math.nan
    for name in CONSTRUCTIONS:
        joint = construct(cond, name, options)
        metrics[name] = pair_metrics(cond, joint.log_prob, own_unary=name == "MLM")
        if joint.change is not None:
            change = joint.change
        del joint
    return PairScores(metrics, change)
