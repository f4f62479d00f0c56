"""`dscore rescore`: ASR/MT N-best lists rescored with a masked LM (and a causal LM), the interpolation
weights tuned on dev and applied to test."""

from __future__ import annotations

import argparse

from ..config import ScoringOptions
from ..errors import UserError
from .common import add_long_texts, add_model_arguments, finish, model_spec, ray_options, shard_rows, student_folder


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dev", required=True, help="dev N-best list (see --format): weights are tuned here")
    p.add_argument(
        "--test", required=True, help="test N-best list: the tuned weights are applied here, and it is written back"
    )
    p.add_argument(
        "--dev-refs",
        default=None,
        help="references of the dev set, if not in the N-best file: JSONL/Parquet (utt_id, ref), TSV, mlm-scoring "
        "JSON, or text (one line per utterance in id order, or Kaldi-style `utt_id ref`)",
    )
    p.add_argument("--test-refs", default=None, help="references of the test set, if not in the N-best file")
    _add_format_arguments(p)
    add_model_arguments(p, maskless=True)
    add_long_texts(p)
    p.add_argument(
        "--method",
        choices=("pll", "unmasked"),
        default="pll",
        help="the masked LM's score of a hypothesis: its PLL (default), or one pass of the unmasked text "
        "(as `dscore score --method unmasked`); --maskless DIR uses a student instead",
    )
    p.add_argument("--causal-model", default=None, help="also interpolate a causal LM (log P with its BOS/EOS)")
    _add_search_arguments(p)
    p.add_argument("--append", default="", help="text appended to each hypothesis before LM scoring ('.' for ASR)")


def _add_format_arguments(p: argparse.ArgumentParser) -> None:
    """How the N-best lists are read: `RescoreInputs`' fmt, kaldi_acwt and beam_size."""
    from ..workflows.rescore.run import NBEST_FORMATS

    p.add_argument(
        "--format",
        dest="nbest_format",
        choices=NBEST_FORMATS,
        default="auto",
        help="format of --dev and --test (default auto: told by content; refused when it cannot be told)",
    )
    p.add_argument(
        "--kaldi-acwt",
        type=float,
        default=1.0,
        help="acoustic scale of Kaldi n-best lists: score = -(acwt * ac_cost + lm_cost) (default 1.0; Kaldi "
        "recipes decode at 1/LMWT, e.g. 0.1)",
    )
    p.add_argument(
        "--beam-size",
        type=int,
        default=None,
        help="candidates per utterance of a NeMo beam TSV (which has no ids; else told from the references' count)",
    )


def _add_search_arguments(p: argparse.ArgumentParser) -> None:
    """How the weights are searched on dev and the metric judged, `RescoreOptions`' fields."""
    from ..workflows.rescore.search import METRICS, RescoreOptions

    d = RescoreOptions()
    p.add_argument("--metric", choices=METRICS, default=d.metric, help="wer (ASR, minimised) or bleu (MT, maximised)")
    p.add_argument(
        "--mlm-alpha",
        type=float,
        default=d.mlm_alpha,
        help="GNMT length-penalty exponent on the PLL (default: 0 for wer; searched on dev for bleu)",
    )
    p.add_argument(
        "--causal-alpha",
        type=float,
        default=d.causal_alpha,
        help="GNMT length-penalty exponent on log P (default: 0 for wer; searched on dev for bleu)",
    )
    p.add_argument(
        "--seq-alpha",
        type=float,
        default=d.seq_alpha,
        help="GNMT normalisation of the sequence model's score (0 off; 0.6 for NMT)",
    )
    p.add_argument(
        "--lambda-max",
        type=float,
        default=d.lambda_max,
        help=f"top of the first LM-weight grid (default {d.lambda_max:g}; doubled while the optimum sits there)",
    )
    p.add_argument(
        "--lambda-limit",
        type=float,
        default=d.lambda_limit,
        help=f"largest LM weight the grid may be extended to (default {d.lambda_limit:g})",
    )
    p.add_argument("--bleu-tokenize", default=d.bleu_tokenize, help="sacrebleu tokenizer ('none' for tokenised text)")


def run(args: argparse.Namespace) -> int:
    from ..workflows.rescore.run import RescoreInputs, rescore_nbest
    from ..workflows.rescore.search import RescoreOptions

    inputs = RescoreInputs(
        args.dev,
        args.test,
        args.output,
        args.dev_refs,
        args.test_refs,
        args.append,
        shard_rows(args),
        args.nbest_format,
        args.kaldi_acwt,
        args.beam_size,
    )
    options = RescoreOptions(
        metric=args.metric,
        mlm_alpha=args.mlm_alpha,
        causal_alpha=args.causal_alpha,
        seq_alpha=args.seq_alpha,
        lambda_max=args.lambda_max,
        lambda_limit=args.lambda_limit,
        bleu_tokenize=args.bleu_tokenize,
    )
    scoring = ScoringOptions(args.variant, args.batch_tokens, long_texts=args.long_texts)
    causal = model_spec(args, args.causal_model) if args.causal_model else None
    student = student_folder(args)
    if student and args.method != "pll":
        raise UserError(f"--maskless DIR scores with a student; it does not go with --method {args.method}")
    result = rescore_nbest(
        inputs,
        model_spec(args, student),
        causal,
        scoring,
        options,
        ray_options(args),
        args.overwrite,
        method="maskless" if student else args.method,
    )
    keys = ("metric", "lambda", "gamma", "mlm_alpha", "causal_alpha", "dev", "test", "edges", "scoring")
    return finish(args, {k: result.report[k] for k in keys})
