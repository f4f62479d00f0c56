"""The orders a chain-rule log-likelihood is taken along (`chain`): `l2r`, `r2l`, or permutations drawn from
a seeded generator; generation (`workloads.generate`) fills its masks in them too. numpy only, so that a
driver checks an order without torch.
"""

from __future__ import annotations

import numpy as np

CHAIN_ORDERS = ("l2r", "r2l", "random")


def orders_for(positions: np.ndarray, order: str, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Orders of `positions` to score in: `l2r` ascending, `r2l` descending (one order each, `k` must be
    1), `random` `k` permutations drawn from `rng` (a seeded generator gives the same orders again)."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    if order not in CHAIN_ORDERS:
        raise ValueError(f"order {order!r} is not one of {CHAIN_ORDERS}")
    if k < 1 or (order != "random" and k != 1):
        raise ValueError(f"{k} orders asked for: `random` takes k >= 1, `{order}` has exactly one")
    if order == "l2r":
        return [positions]
    if order == "r2l":
        return [positions[::-1].copy()]
    return [rng.permutation(positions) for _ in range(k)]
