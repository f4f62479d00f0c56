"""How the Metropolis-Hastings sampler (`sampler`) runs: its settings and their one validation.

Torch-free, so that the sampling workload's options (`workloads.sample.SampleOptions`) derive from them
on the driver: the options carry these fields by name and are checked here, once. The messages name
each setting by its `dscore sample` flag (`burn_in` is `--burn-in`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..options import check, check_bounds, option

ENERGIES = ("raw", "norm")
SAMPLERS = ("mh", "block-mh", "gibbs")
SAMPLING_ORDERS = ("sweep", "random")  # the order an epoch visits the positions in
STARTS = ("given", "random", "warm")


@dataclass(frozen=True)
class SamplerSettings:
    """How to sample. `epochs` are recorded after `burn_in` unrecorded ones (see `sampler`'s docstring).
    Each field's flag (`dscore sample`'s) is declared here once; the sampling options carry them by name."""

    sampler: str = option(
        "mh", "mh (one position), block-mh (--block positions), gibbs (always accepts: a baseline)", choices=SAMPLERS
    )
    energy: str = option("norm", "raw: -sum of masked logits; norm: -PLL (default norm)", choices=ENERGIES)
    epochs: int = option(10, "recorded epochs after burn-in (default {default})", low=1)
    burn_in: int = option(0, "unrecorded epochs first (default 0)", low=0)
    block: int = option(1, "positions per block-mh proposal (default 1)", low=1)  # 1 for `mh`
    block_decay: int = option(  # the paper's block annealing
        0, "block size shrinks by this per epoch, down to 1 (default 0)", low=0
    )
    proposal_temperature: float = option(1.0, "temperature of the MLM proposal (default 1)", low=0, above=True)
    top_p: float = option(1.0, "nucleus of the proposal (default 1: off)", low=0, high=1, above=True)
    target_temperature: float = option(1.0, "T of the target exp(-E/T) (default 1)", low=0, above=True)
    anneal: float = option(
        0.0, "subtracted from the target temperature each epoch, for mode finding (default 0)", low=0
    )
    min_target_temperature: float = 0.01  # the floor of annealing
    order: str = option("sweep", "positions in order, or a seeded permutation", choices=SAMPLING_ORDERS)
    start: str = option("given", "how a chain starts", choices=STARTS)
    record_every: int = option(1, "record every N epochs (default 1)", low=1)  # and always the last epoch
    forced_accept: int = option(  # epochs (from the start) whose proposals are all accepted, as `gibbs` does
        0,
        "accept every proposal of the first N epochs (Goyal et al.'s trick after a warm start; keep N within "
        "--burn-in) (default 0)",
        low=0,
    )

    def __post_init__(self) -> None:
        check(self)
        if self.sampler == "mh" and (self.block != 1 or self.block_decay):
            raise UserError("--sampler mh proposes one position at a time: use --sampler block-mh with --block")
        check_bounds("min_target_temperature", self.min_target_temperature, 0, above=True)

    def target_temperature_at(self, epoch: int) -> float:
        """T of epoch `epoch` (1-based, burn-in included): linear annealing, floored."""
        return max(self.min_target_temperature, self.target_temperature - self.anneal * (epoch - 1))

    def block_at(self, epoch: int) -> int:
        """Block size of epoch `epoch` (1-based, burn-in included)."""
        return max(1, self.block - self.block_decay * (epoch - 1))
