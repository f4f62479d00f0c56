"""`dscore variants`: variant effects of ProteinGym deep-mutational-scan tables, by the wild-type, masked or
mutant marginal or the PLL difference, each variant's score joined back to its row."""

from __future__ import annotations

import argparse

from .common import add_long_texts, add_model_arguments, finish, model_spec, ray_options, shard_rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.variants.run import STRATEGIES

    p.add_argument(
        "table",
        metavar="TABLE",
        help="a ProteinGym DMS table (CSV, JSONL or Parquet: mutant such as A23G:K45R, mutated_sequence, DMS_score, "
        "DMS_score_bin), or with --reference the folder of the tables it names",
    )
    wild = p.add_mutually_exclusive_group(required=True)
    wild.add_argument("--target-seq", default=None, metavar="SEQ", help="the wild type, one letter per residue")
    wild.add_argument(
        "--reference",
        default=None,
        metavar="REFERENCE.csv",
        help="ProteinGym's reference file (DMS_id, DMS_filename, target_seq, ...): every assay it lists is scored",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        required=True,
        help="wt-marginal (1 pass per wild type, per window of a long one), masked-marginal (one masked pass per "
        "mutated position of the wild type), mutant-marginal (1 pass per variant) or pll (PLL(mutant) - PLL(wild "
        "type), L passes per sequence)",
    )
    p.add_argument(
        "--offset",
        type=int,
        default=1,
        help="the number of the target's first residue in `mutant` (default 1: ProteinGym's 1-based positions)",
    )
    add_model_arguments(p, shard_rows=1000, variant=False, fit_actors=True)
    add_long_texts(p)


def run(args: argparse.Namespace) -> int:
    from ..workflows.variants.run import VariantsInputs, score_variants

    inputs = VariantsInputs(
        args.table,
        args.output,
        args.strategy,
        args.target_seq,
        args.reference,
        args.offset,
        shard_rows(args),
        fit_actors=args.shard_rows is None,
    )
    summary = score_variants(
        inputs, model_spec(args), args.batch_tokens, ray_options(args), args.overwrite, args.long_texts
    )
    return finish(args, {k: v for k, v in summary.items() if k != "by_assay"} | {"by_assay": summary["by_assay"]})
