"""How the Metropolis-Hastings sampler (`sampler`) runs: its settings and their one validation.

Torch-free, so that the sampling workload's options (`workloads.sample.SampleOptions`) derive from them
on the driver: the options carry these fields by name and are checked here, once. The messages name
each setting by its `dscore sample` flag (`burn_in` is `--burn-in`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_bounds
from ..errors import UserError

ENERGIES = ("raw", "norm")
SAMPLERS = ("mh", "block-mh", "gibbs")
SAMPLING_ORDERS = ("sweep", "random")  # the order an epoch visits the positions in
STARTS = ("given", "random", "warm")


@dataclass(frozen=True)
class SamplerSettings:
    """How to sample. `epochs` are recorded after `burn_in` unrecorded ones (see `sampler`'s docstring)."""

    sampler: str = "mh"
    energy: str = "norm"
    epochs: int = 10
    burn_in: int = 0
    block: int = 1  # positions per proposal: 1 for `mh`; block-mh (and block Gibbs) take more
    block_decay: int = 0  # block size shrinks by this per epoch, down to 1 (the paper's block annealing)
    proposal_temperature: float = 1.0
    top_p: float = 1.0  # nucleus of the proposal; 1 keeps every allowed token
    target_temperature: float = 1.0
    anneal: float = 0.0  # subtracted from the target temperature per epoch
    min_target_temperature: float = 0.01
    order: str = "sweep"
    start: str = "given"
    record_every: int = 1  # record every this many epochs after burn-in (and always the last epoch)
    forced_accept: int = 0  # epochs (from the start) whose proposals are all accepted, as `gibbs` does

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("energy", self.energy, ENERGIES),
            ("sampler", self.sampler, SAMPLERS),
            ("start", self.start, STARTS),
            ("order", self.order, SAMPLING_ORDERS),
        ):
            if value not in choices:
                raise UserError(f"--{name} {value!r} is not one of {', '.join(choices)}")
        for flag, value, low in (
            ("--epochs", self.epochs, 1),
            ("--block", self.block, 1),
            ("--record-every", self.record_every, 1),
            ("--burn-in", self.burn_in, 0),
            ("--block-decay", self.block_decay, 0),
            ("--forced-accept", self.forced_accept, 0),
        ):
            check_bounds(flag, value, low)
        if self.sampler == "mh" and (self.block != 1 or self.block_decay):
            raise UserError("--sampler mh proposes one position at a time: use --sampler block-mh with --block")
        check_bounds("--proposal-temperature", self.proposal_temperature, 0, above=True)
        check_bounds("--target-temperature", self.target_temperature, 0, above=True)
        check_bounds("--anneal", self.anneal, 0)
        check_bounds("--top-p", self.top_p, 0, 1, above=True)
        check_bounds("min_target_temperature", self.min_target_temperature, 0, above=True)

    def target_temperature_at(self, epoch: int) -> float:
        """T of epoch `epoch` (1-based, burn-in included): linear annealing, floored."""
        return max(self.min_target_temperature, self.target_temperature - self.anneal * (epoch - 1))

    def block_at(self, epoch: int) -> int:
        """Block size of epoch `epoch` (1-based, burn-in included)."""
        return max(1, self.block - self.block_decay * (epoch - 1))
