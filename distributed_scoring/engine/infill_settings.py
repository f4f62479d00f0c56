"""How infilling searches (`infill`): its decoders, fill orders and settings, and their one validation.

Torch-free, so that the infilling workload's options (`workloads.infill.InfillOptions`) take these fields
by name on the driver, with their flags (`dscore infill`'s), defaults and bounds declared here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import check, check_bounds, option

DECODERS = ("standard", "hcb", "exact", "sample", "temperature", "top-k", "top-p", "filtered")
SAMPLERS = ("sample", "temperature", "top-k", "top-p", "filtered")
FILL_ORDERS = ("l2r", "best-to-worst", "given")


@dataclass(frozen=True)
class InfillSettings:
    """How to search: the decoder, the order, the beam width (chains for samplers) and each sampler's knob.
    Each field's flag (`dscore infill`'s) is declared here once; its options carry them by name."""

    decoder: str = option(
        "standard",
        "standard or hcb beam search, exact enumeration, or a sampling baseline (default standard)",
        choices=DECODERS,
    )
    order: str = option("l2r", "fill order (default l2r)", choices=FILL_ORDERS)
    beam: int = option(5, "beam width, or chains of a sampler (default {default})", low=1)
    pivot: int | None = None  # token id whose log-probability HCB subtracts; None: the mask token
    temperature: float = option(1.0, "temperature sampler's T (default 1)", low=0, above=True)
    top_k: int = option(10, "top-k sampler's k (default {default})", low=0, name="--sample-top-k")  # 0: off
    top_p: float = option(0.9, "nucleus sampler's p (default {default})", low=0, high=1, above=True)

    def __post_init__(self) -> None:
        check(self)
        if self.decoder != "filtered":  # only `filtered` may leave top-k off
            check_bounds("--sample-top-k", self.top_k, 1)

    @property
    def filters(self) -> tuple[float, int, float]:
        """(temperature, top-k, top-p) a sampler applies, in that order (top-k 0 and top-p 1 are off):
        a baseline its own knob alone (`sample` none), `filtered` all three as set."""
        if self.decoder == "filtered":
            return self.temperature, self.top_k, self.top_p
        return (
            self.temperature if self.decoder == "temperature" else 1.0,
            self.top_k if self.decoder == "top-k" else 0,
            self.top_p if self.decoder == "top-p" else 1.0,
        )
