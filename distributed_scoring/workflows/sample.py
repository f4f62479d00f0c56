"""`dscore sample`: Metropolis-Hastings chains from an MLM's energy for every input row, then a summary.

The rows go through the shared shard pipeline (resumable, in this process or on Ray). `summary.json`
holds the acceptance rate and the novel-transition rate (accepted proposals that changed the sequence)
over all chains, the mean of both energies at each recorded epoch, and, for rows with an answer (the
true tokens at the sampled positions), the per-token accuracy of the final and of the lowest-energy
sample of each chain (lowest under the run's own energy) and the corpus BLEU of those samples' tokens
against the answers (as for infilling: `workflows.infill.token_bleu`). `energy.png` plots the energy
curves.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pyarrow.compute as pc

from ..config import RayOptions, RunConfig
from ..errors import UserError
from ..io import schema as S
from ..io.output import OutputDir
from ..pipeline.memory import check_memory, text_tokens
from ..pipeline.runner import Finished, run
from ..workloads.infill import allowed_tokens
from ..workloads.sample import (
    ACCEPTED,
    ANSWER,
    CHAIN,
    CORRECT,
    ENERGY_NORM,
    ENERGY_RAW,
    EPOCH,
    NOVEL,
    PROPOSALS,
    SAMPLED,
    SampleOptions,
    memory_estimate,
    sample_workload,
)
from .infill import token_bleu

__all__ = ["SampleOptions", "sample", "summarize"]  # SampleOptions: what the CLI builds a run from

logger = logging.getLogger(__name__)

PLOT = "energy.png"


def sample(config: RunConfig, options: SampleOptions, ray: RayOptions | None = None, overwrite: bool = False) -> dict:
    """Run every row's chains; returns the summary (also written to summary.json)."""
    from ..engine.model_files import load_tokenizer

    tokenizer, max_length = load_tokenizer(config.model)
    if tokenizer.mask_token is None:
        raise UserError(f"{config.model.name!r} has no mask token, so it has no MLM conditionals to propose from")
    allowed_tokens(tokenizer, len(tokenizer), options.vocab_restrict)
    check_memory("dscore sample", memory_estimate(options, config.inputs.shard_rows, text_tokens(max_length)))
    config = replace(config, inputs=replace(config.inputs, extra_columns=(options.answer_column,)))
    workload = sample_workload(config.model, options, config.scoring.batch_tokens)
    return run(
        config, workload, ray, overwrite, summarise=lambda done: summarize(done, options), report=_plot, outputs=(PLOT,)
    )


def summarize(done: Finished, options: SampleOptions) -> dict:
    """The figures of `summary.json` from the finished run's rows (see the module docstring), and its model."""
    table = done.out.read_rows()
    ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK))
    key = [S.ID, *([S.LINE] if S.LINE in table.column_names else []), CHAIN]  # a chain's rows
    rows = ok.select(
        [*key, EPOCH, ENERGY_RAW, ENERGY_NORM, PROPOSALS, ACCEPTED, NOVEL, CORRECT, "n_sampled", SAMPLED, ANSWER]
    ).to_pylist()
    proposals = sum(r[PROPOSALS] for r in rows)
    by_epoch: dict[int, list[dict]] = {}
    for r in rows:
        by_epoch.setdefault(r[EPOCH], []).append(r)
    summary = {
        "rows": table.num_rows,
        "ok": ok.num_rows,
        "errors": table.num_rows - ok.num_rows,
        "sampler": options.sampler,
        "energy": options.energy,
        "chains": options.chains,
        "epochs": options.epochs,
        "burn_in": options.burn_in,
        "forced_accept": options.forced_accept,
        "seed": options.seed,
        "acceptance_rate": sum(r[ACCEPTED] for r in rows) / proposals if proposals else None,
        "novel_rate": sum(r[NOVEL] for r in rows) / proposals if proposals else None,
        "energy_by_epoch": {
            str(e): {"raw": _mean(rs, ENERGY_RAW), "norm": _mean(rs, ENERGY_NORM)} for e, rs in sorted(by_epoch.items())
        },
    }
    judged = [r for r in rows if r[CORRECT] is not None]
    if judged:
        chains: dict[tuple, list[dict]] = {}
        for r in judged:
            chains.setdefault(tuple(r[k] for k in key), []).append(r)
        energy = ENERGY_RAW if options.energy == "raw" else ENERGY_NORM
        final = [max(rs, key=lambda r: r[EPOCH]) for rs in chains.values()]
        lowest = [min(rs, key=lambda r: (r[energy], r[EPOCH])) for rs in chains.values()]
        summary["accuracy"] = {"final": _accuracy(final), "lowest_energy": _accuracy(lowest)}
        summary["bleu"] = {"final": _bleu(final), "lowest_energy": _bleu(lowest)}
    summary["model"] = done.config.model.name
    return summary


def _mean(rows: list[dict], column: str) -> float:
    return sum(r[column] for r in rows) / len(rows)


def _accuracy(rows: list[dict]) -> float:
    return sum(r[CORRECT] for r in rows) / sum(r["n_sampled"] for r in rows)


def _bleu(rows: list[dict]) -> dict:
    return token_bleu([r[SAMPLED] for r in rows], [r[ANSWER] for r in rows])


def _plot(out: OutputDir, summary: dict) -> None:
    """Mean energies by epoch, both kinds, in one small PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [int(e) for e in summary["energy_by_epoch"]]
    figure, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, kind in zip(axes, ("raw", "norm")):
        ax.plot(epochs, [summary["energy_by_epoch"][str(e)][kind] for e in epochs], marker="o")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"mean E_{kind}")
        if not epochs:  # the plot is still written: `_run.json` lists it, and verify expects every output listed
            ax.text(0.5, 0.5, "no chain sampled (every row an error)", ha="center", va="center", transform=ax.transAxes)
    figure.suptitle(f"{summary['sampler']} on E_{summary['energy']}: acceptance {summary['acceptance_rate'] or 0:.2f}")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    out.write_bytes(PLOT, buffer.getvalue())
