"""`dscore`: thin commands that parse, call one library function and print its result."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

from .config import DEVICES, DTYPES, VARIANTS, InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from .errors import DataLossError, UserError


def _add_score_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text files (one sentence per line), JSONL or Parquet with a text column")
    p.add_argument("--model", required=True, help="local model folder or Hub id of a masked LM")
    p.add_argument("--output", required=True, help="output folder (local path or object-store URI)")
    p.add_argument("--variant", choices=VARIANTS, default="original",
                   help="original (Salazar et al. 2020) or word_l2r (Kauf & Ivanova 2023)")
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    p.add_argument("--id-column", default=None, help="column or JSON field holding a row id (default: file:line)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="token budget of one forward pass, rows x padded length (default: 1024 CPU, 65536 CUDA)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="encoder autocast dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--revision", default=None, help="model revision (Hub models)")
    p.add_argument("--per-token", action="store_true", help="also write scored tokens and their log-probs")
    p.add_argument("--word-scores", action="store_true", help="also write per-word scores (sums over pieces)")
    p.add_argument("--shard-rows", type=int, default=1000, help="rows per shard: the unit of work and resume")
    p.add_argument("--partition-column", default=None,
                   help="column whose value partitions the rows (kept as `partition`; figures per partition)")
    p.add_argument("--partition-by-file", action="store_true", help="partition the rows by input file")
    p.add_argument("--overwrite", action="store_true", help="replace results of a different run in --output")
    ray = p.add_argument_group("Ray", "score on Ray actors instead of in this process")
    ray.add_argument("--ray", action="store_true", help="run the Ray Data pipeline (embedded local Ray by default)")
    ray.add_argument("--address", default=None,
                     help="Ray cluster to join: 'auto', host:port or ray://...; default $RAY_ADDRESS, else embedded")
    ray.add_argument("--num-actors", type=int, default=None,
                     help="scoring actors, one model replica each (default: one per GPU, else as CPUs allow)")
    ray.add_argument("--cpus-per-actor", type=float, default=None, help="CPUs of each CPU scoring actor (default 4 or fewer)")
    ray.add_argument("--stall-timeout", type=float, default=1800.0,
                     help="fail when no shard finishes for this many seconds (default 1800)")


def _config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        inputs=InputSpec(tuple(args.inputs), args.text_column, args.id_column, args.shard_rows,
                         args.partition_column, args.partition_by_file),
        model=ModelSpec(args.model, args.revision, args.device, args.dtype),
        scoring=ScoringOptions(args.variant, args.batch_tokens, args.per_token, args.word_scores),
        output=args.output,
    )


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    """Ray options when --ray or --address was given, else None (score in this process)."""
    if not (args.ray or args.address):
        return None
    return RayOptions(args.address, args.num_actors, args.cpus_per_actor, args.stall_timeout)


def _score(args: argparse.Namespace) -> int:
    from .runner import score

    summary = score(_config(args), _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0


def _fetch_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .offline_models import fetch_model

    print(fetch_model(args.name, Path(args.cache) if args.cache else None))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .offline_models import MODELS

    parser = argparse.ArgumentParser(prog="dscore", description="Masked-LM scoring: PLL and pseudo-perplexity")
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="PLL of every sentence, Parquet out, corpus PPPL in summary.json")
    _add_score_arguments(score)
    score.set_defaults(func=_score)
    fetch = commands.add_parser("fetch-model", help="download and convert an offline model; prints its folder")
    fetch.add_argument("name", choices=sorted(MODELS))
    fetch.add_argument("--cache", default=None, help="cache folder (default: $DSCORE_CACHE or ~/.cache/distributed-scoring)")
    fetch.set_defaults(func=_fetch_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .models import quiet_transformers

    quiet_transformers()
    try:
        return args.func(args)
    except UserError as exc:
        print(f"dscore: error: {exc}", file=sys.stderr)
        return 2
    except DataLossError as exc:
        print(f"dscore: incomplete: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
