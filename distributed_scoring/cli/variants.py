"""`dscore variants`: variant effects of ProteinGym deep-mutational-scan tables, by the wild-type, masked or
mutant marginal or the PLL difference, each variant's score joined back to its row."""

from __future__ import annotations

import argparse

from .common import (
    Command,
    add_long_texts,
    add_model_arguments,
    add_options,
    finish,
    model_spec,
    options_from,
    ray_options,
    shard_rows,
)

COMMAND = Command(
    "variants",
    "protein variant effects of DMS tables (ProteinGym): wt-, masked-, mutant-marginal or PLL difference",
    description="Writes DIR/variants.parquet (every input column, DMS_id, score, n_mutations, status, error), "
    "summary.json (forward_passes; per assay Spearman with DMS_score and AUC of DMS_score_bin, with bootstrap "
    "intervals), report.md and scatter.png. Exit codes: 0 done, 1 rows lost, 2 bad input or options.",
    place=90,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.variants.run import VariantsInputs

    p.add_argument(
        "table",
        metavar="TABLE",
        help="a ProteinGym DMS table (CSV, JSONL or Parquet: mutant such as A23G:K45R, mutated_sequence, DMS_score, "
        "DMS_score_bin), or with --reference the folder of the tables it names",
    )
    wild = p.add_mutually_exclusive_group(required=True)
    add_options(wild, VariantsInputs, ["target_seq", "reference"])
    add_options(p, VariantsInputs, ["strategy", "offset", "windows"])
    add_model_arguments(p, shard_rows=1000, variant=False, fit_actors=True)
    add_long_texts(p)


def run(args: argparse.Namespace) -> int:
    from ..workflows.variants.run import VariantsInputs, score_variants

    inputs = options_from(
        args,
        VariantsInputs,
        table=args.table,
        output=args.output,
        shard_rows=shard_rows(args),
        fit_actors=args.shard_rows is None,
    )
    summary = score_variants(
        inputs, model_spec(args), args.batch_tokens, ray_options(args), args.overwrite, args.long_texts
    )
    return finish(args, {k: v for k, v in summary.items() if k != "by_assay"} | {"by_assay": summary["by_assay"]})
