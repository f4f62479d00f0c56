"""`dscore sample`: Metropolis-Hastings (and Gibbs) chains from an MLM's energy, proposals from the MLM."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import add_corpus_arguments, add_vocab_restrict, finish, prompt_config, ray_options, vocabulary

if TYPE_CHECKING:
    from ..workflows.sample import SampleOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.sample import SampleOptions

    d = SampleOptions()
    add_corpus_arguments(
        p,
        "texts with the model's mask token at the positions to sample (or any text with --free-all)",
        shard_rows=50,
        variant=False,
    )
    p.add_argument(
        "--answer-column",
        default=d.answer_column,
        help="column with the true tokens at the sampled positions, space-separated (optional)",
    )
    _add_chain_arguments(p, d)
    _add_proposal_arguments(p, d)
    add_vocab_restrict(p, "the only tokens a proposal may use, space-separated (as in dscore infill)")


def _add_chain_arguments(p: argparse.ArgumentParser, d: SampleOptions) -> None:
    """What each chain samples and for how long: its energy, its sampler, its epochs, how many chains and
    which positions; `d` gives the defaults."""
    from ..workflows.sample import ENERGIES, SAMPLERS

    p.add_argument(
        "--energy", choices=ENERGIES, default=d.energy, help="raw: -sum of masked logits; norm: -PLL (default norm)"
    )
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default=d.sampler,
        help="mh (one position), block-mh (--block positions), gibbs (always accepts: a baseline)",
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"recorded epochs after burn-in (default {d.epochs})")
    p.add_argument("--burn-in", type=int, default=d.burn_in, help="unrecorded epochs first (default 0)")
    p.add_argument("--chains", type=int, default=d.chains, help="chains per input row (default 1)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (with each row's id and chain number)")
    p.add_argument("--free-all", action="store_true", help="sample every position, starting from the given text")
    p.add_argument("--block", type=int, default=d.block, help="positions per block-mh proposal (default 1)")
    p.add_argument(
        "--block-decay",
        type=int,
        default=d.block_decay,
        help="block size shrinks by this per epoch, down to 1 (default 0)",
    )


def _add_proposal_arguments(p: argparse.ArgumentParser, d: SampleOptions) -> None:
    """How proposals are drawn and accepted along a chain: temperatures and their schedule, the nucleus,
    the order and start of the positions, what is recorded; `d` gives the defaults."""
    from ..workflows.sample import SAMPLING_ORDERS, STARTS

    p.add_argument(
        "--proposal-temperature",
        type=float,
        default=d.proposal_temperature,
        help="temperature of the MLM proposal (default 1)",
    )
    p.add_argument(
        "--target-temperature", type=float, default=d.target_temperature, help="T of the target exp(-E/T) (default 1)"
    )
    p.add_argument(
        "--anneal",
        type=float,
        default=d.anneal,
        help="subtracted from the target temperature each epoch, for mode finding (default 0)",
    )
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus of the proposal (default 1: off)")
    p.add_argument("--record-every", type=int, default=d.record_every, help="record every N epochs (default 1)")
    p.add_argument(
        "--order", choices=SAMPLING_ORDERS, default=d.order, help="positions in order, or a seeded permutation"
    )
    p.add_argument(
        "--start",
        choices=STARTS,
        default=d.start,
        help="auto: warm (greedy fill) where mask tokens are sampled, else as given",
    )
    p.add_argument(
        "--forced-accept",
        type=int,
        default=d.forced_accept,
        help="accept every proposal of the first N epochs (Goyal et al.'s trick after a warm start; "
        "keep N within --burn-in) (default 0)",
    )


def run(args: argparse.Namespace) -> int:
    from ..workflows.sample import SampleOptions, sample

    options = SampleOptions(
        args.energy,
        args.sampler,
        args.epochs,
        args.burn_in,
        args.chains,
        args.seed,
        args.free_all,
        args.block,
        args.block_decay,
        args.proposal_temperature,
        args.target_temperature,
        args.anneal,
        args.top_p,
        args.record_every,
        args.order,
        args.start,
        vocabulary(args),
        args.answer_column,
        args.forced_accept,
    )
    return finish(args, sample(prompt_config(args), options, ray_options(args), overwrite=args.overwrite))
