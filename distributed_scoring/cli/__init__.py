"""`dscore`: thin commands that parse, call one library function and print its result."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from typing import Sequence

from ..config import DEVICES, DTYPES, VARIANTS, InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ..cpus import thread_env
from ..errors import DataLossError, UserError
from ..quiet import quiet_transformers

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # every command's log lines on standard error


def _add_model_arguments(p: argparse.ArgumentParser, shard_rows: int = 1000, variant: bool = True,
                         maskless: bool = False) -> None:
    """Which masked LM, where its results go, and how it runs: shared by every scoring command.
    `variant`: the command computes PLLs, whose masking the variant chooses. `maskless`: a maskless
    student (`--maskless DIR`) may stand in for the masked LM's PLLs."""
    p.add_argument("--model", required=not maskless, help="local model folder or Hub id of a masked LM")
    if maskless:
        p.add_argument("--maskless", default=None, metavar="DIR",
                       help="instead of --model: predict each PLL in one forward pass with a student trained by "
                       "`dscore train maskless` (its --output folder)")
    p.add_argument("--output", required=True, help="output folder (local path or object-store URI)")
    if variant:
        p.add_argument("--variant", choices=VARIANTS, default="original",
                       help="original (Salazar et al. 2020) or word_l2r (Kauf & Ivanova 2023)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="token budget of one forward pass, rows x padded length (default: 1024 CPU, 65536 CUDA)")
    p.add_argument("--device", type=_device, default="auto",
                   help="auto (CUDA when torch sees a GPU), cpu, cuda, or cuda:N for one GPU of this machine")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="encoder autocast dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--revision", default=None, help="model revision (Hub models)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run Python code shipped with the model (off: such models are refused)")
    p.add_argument("--shard-rows", type=int, default=shard_rows,
                   help=f"rows per shard: the unit of work and resume (default {shard_rows})")
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
    _add_verbose(ray, default=argparse.SUPPRESS)  # after the command too, without resetting `dscore --verbose`


def _device(value: str) -> str:
    """`--device`: one of DEVICES or cuda:N."""
    if value in DEVICES or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(DEVICES)} or cuda:N")


def _add_verbose(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: object = False) -> None:
    p.add_argument("--verbose", action="store_true", default=default,
                   help="also show Ray's own messages, its workers' output and Ray Data's progress bars on the "
                   "terminal (they always go to the run log in Ray's session folder)")


def _add_id_arguments(p: argparse.ArgumentParser,
                      meaning: str = "column or JSON field holding a row id (default: file:line)") -> None:
    p.add_argument("--id-column", default=None, help=f"{meaning}; ids must be unique")
    p.add_argument("--allow-duplicate-ids", action="store_true",
                   help="keep rows whose --id-column values repeat (refused otherwise, before any work); the rows "
                   "then carry a `line` column (file:record) and are keyed by id and line")


def _add_score_arguments(p: argparse.ArgumentParser, per_token_flag: bool = True, maskless: bool = False) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text, JSONL, CSV/TSV or Parquet files, datasets folders, folders or globs of them")
    _add_model_arguments(p, maskless=maskless)
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    _add_id_arguments(p)
    if per_token_flag:
        p.add_argument("--per-token", action="store_true",
                       help="also write scored tokens and their log-probs (with --maskless, a token or distribution "
                       "student's prediction of each)")
        p.add_argument("--conditionals", type=int, default=0, metavar="K",
                       help="with --per-token: also write the K most probable tokens of each scored token's "
                       "conditional and the mass of the rest (K >= the vocabulary: all of it), the targets of "
                       "`dscore train maskless --target distribution` (default 0: off)")
    p.add_argument("--word-scores", action="store_true", help="also write per-word scores (sums over pieces)")
    p.add_argument("--split-chars", action="store_true",
                   help="put a space between characters before tokenising: for per-residue models (protein, "
                   "antibody) given sequences without spaces; n_unknown in the output counts unreadable tokens")
    p.add_argument("--partition-column", default=None,
                   help="column whose value partitions the rows (kept as `partition`; figures per partition)")
    p.add_argument("--partition-by-file", action="store_true", help="partition the rows by input file")


def _model(args: argparse.Namespace, name: str | None = None) -> ModelSpec:
    return ModelSpec(name or args.model, args.revision, args.device, args.dtype, args.trust_remote_code)


def _config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        inputs=InputSpec(tuple(args.inputs), args.text_column, args.id_column, args.shard_rows,
                         args.partition_column, args.partition_by_file,
                         allow_duplicate_ids=args.allow_duplicate_ids),
        model=_model(args, getattr(args, "maskless", None)),
        scoring=ScoringOptions(args.variant, args.batch_tokens, getattr(args, "per_token", False), args.word_scores,
                               args.split_chars, getattr(args, "conditionals", 0)),
        output=args.output,
    )


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    """Ray options when --ray or --address was given, else None (score in this process). They are built
    (and so checked) either way: an absurd --stall-timeout is refused, not ignored."""
    options = RayOptions(args.address, args.num_actors, args.cpus_per_actor, args.stall_timeout, args.verbose)
    return options if args.ray or args.address else None


def _student(args: argparse.Namespace) -> str | None:
    """The --maskless student folder, or None; exactly one of --model and --maskless."""
    if (args.model is None) == (args.maskless is None):
        raise UserError("pass either --model (a masked LM's PLLs) or --maskless DIR (a student's predicted PLLs)")
    return args.maskless


def _score(args: argparse.Namespace) -> int:
    if _student(args):
        from ..workflows.maskless import score_maskless as score
    else:
        from ..workflows.score import score
    summary = score(_config(args), _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _add_chain_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.chain import ORDERS

    g = p.add_argument_group("chain rule", "--method chain: log p(x) = sum_k log p(x_s(k) | x_s(<k)) along an order s "
                             "(the likelihood of a u-PMLM; for other MLMs an approximation)")
    g.add_argument("--method", choices=("pll", "chain", "unmasked"), default="pll",
                   help="pll: pseudo-log-likelihood (default); chain: chain-rule log-likelihood along --order; "
                   "unmasked: one pass of the unmasked sentence, sum of log p(w_t | W) (Salazar et al.'s "
                   "\"no masking\"; a fast, rough stand-in for the PLL)")
    g.add_argument("--order", choices=ORDERS, default=None, help="chain order: left to right (default), right to "
                   "left, or random permutations")
    g.add_argument("--orders", type=int, default=None,
                   help="random orders per sentence, averaged in probability space (default 1)")
    g.add_argument("--seed", type=int, default=None, help="seed of the random orders, with each row's id (default 0)")


def _score_by_method(args: argparse.Namespace) -> int:
    """`dscore score`: the PLL, with --method chain the chain rule, with --method unmasked one pass per
    sentence; flags of another method are an error."""
    if args.method != "chain" and (args.order, args.orders, args.seed) != (None, None, None):
        raise UserError("--order, --orders and --seed belong to --method chain")
    if args.conditionals and (args.method != "pll" or args.maskless):
        raise UserError("--conditionals saves the PLL's conditionals: it goes with --method pll and --model only")
    if args.variant != "original" and (args.method == "unmasked" or args.maskless):
        raise UserError("--variant chooses the PLL's masking; one pass of the unmasked sentence (--method unmasked, "
                        "--maskless) masks nothing: drop it")
    if args.method == "pll":
        return _score(args)
    if _student(args):
        raise UserError(f"--maskless predicts PLLs; it does not go with --method {args.method}")
    if args.method == "unmasked":
        from ..workflows.maskless import score_unmasked

        summary = score_unmasked(_config(args), _ray_options(args), overwrite=args.overwrite)
        print(json.dumps(summary, indent=2), file=args.result)
        return 0
    from ..workflows.chain import ChainOptions, score_chain

    d = ChainOptions()
    options = ChainOptions(d.order if args.order is None else args.order,
                           d.orders if args.orders is None else args.orders,
                           d.seed if args.seed is None else args.seed, args.split_chars)
    summary = score_chain(_config(args), options, _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _add_audit_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.audit.baseline import EXIT_INSUFFICIENT, METRICS, Thresholds
    from ..workflows.audit.outliers import SCOPES, OutlierRule

    t, o = Thresholds(), OutlierRule()
    g = p.add_argument_group("audit", "baseline comparison and outliers")
    g.add_argument("--baseline", default=None, help="the previous run's audit.json (or its folder; path or URI)")
    g.add_argument("--metric", choices=METRICS, default=t.metric, help=f"PPPL compared with the baseline (default {t.metric})")
    g.add_argument("--max-pppl-increase", type=float, default=t.max_pppl_increase,
                   help=f"relative PPPL rise that counts as a regression (default {t.max_pppl_increase})")
    g.add_argument("--max-pppl-decrease", type=float, default=t.max_pppl_decrease,
                   help="relative PPPL fall that also counts as a regression, a corpus that got suspiciously easy "
                        "(default: none; a fall is an improvement)")
    g.add_argument("--max-error-rate-increase", type=float, default=t.max_error_rate_increase,
                   help=f"absolute error-rate rise that counts as a regression (default {t.max_error_rate_increase})")
    g.add_argument("--min-rows", type=int, default=t.min_rows,
                   help=f"a scope with fewer rows on either side is 'insufficient data' (default {t.min_rows})")
    g.add_argument("--confidence", type=float, default=t.confidence,
                   help=f"confidence level of the intervals that verdicts are read from (default {t.confidence})")
    g.add_argument("--seed", type=int, default=t.seed, help="seed of the bootstrap (recorded in audit.json)")
    g.add_argument("--accept-insufficient", action="store_true",
                   help=f"do not fail (exit {EXIT_INSUFFICIENT}) when some scope has too little data to judge")
    g.add_argument("--outlier-min-sigma", type=float, default=o.min_sigma,
                   help=f"the smallest robust sigma, in nats per token, the outlier rule divides by (default "
                   f"{o.min_sigma:g}; 0 for none): a partition of near-identical sentences measures a tiny one")
    g.add_argument("--outlier-k", type=float, default=o.k,
                   help=f"flag sentences whose NLL/token is over median + k robust sigmas (default {o.k})")
    g.add_argument("--outlier-scope", choices=SCOPES, default=o.scope,
                   help="one outlier rule per partition (default), or one for the whole corpus")
    g.add_argument("--low-tail", action="store_true", help="also flag sentences far below the median NLL/token")


def _audit(args: argparse.Namespace) -> int:
    from ..workflows.audit.figures import AuditConfig
    from ..workflows.audit.baseline import Thresholds
    from ..workflows.audit.outliers import OutlierRule
    from ..workflows.audit.run import audit_snapshot

    config = AuditConfig(
        outliers=OutlierRule(k=args.outlier_k, low_tail=args.low_tail, scope=args.outlier_scope,
                             min_sigma=args.outlier_min_sigma),
        thresholds=Thresholds(metric=args.metric, max_pppl_increase=args.max_pppl_increase,
                              max_pppl_decrease=args.max_pppl_decrease,
                              max_error_rate_increase=args.max_error_rate_increase, min_rows=args.min_rows,
                              confidence=args.confidence, seed=args.seed,
                              accept_insufficient=args.accept_insufficient),
    )
    result = audit_snapshot(_config(args), _ray_options(args), args.baseline, config, overwrite=args.overwrite,
                            maskless=_student(args) is not None)
    audit, comparison = result.record, result.comparison
    print(json.dumps({
        "rows": audit.overall.rows, "pppl_token": audit.overall.pppl_token,
        "pppl_word": audit.overall.pppl_word, "outliers": audit.outliers.count,
        "verdict": comparison.verdict if comparison else "no baseline",
        "regressed": [c.name for c in comparison.regressions] if comparison else [],
        "insufficient": [c.name for c in comparison.insufficient] if comparison else [],
        "scopes": {c.name: c.status for c in (comparison.overall, *comparison.partitions)} if comparison else {},
        "new_partitions": comparison.new_partitions if comparison else [],
        "vanished_partitions": comparison.vanished_partitions if comparison else [],
        "exit_code": result.exit_code, "report": result.report_path,
        **({"estimate": audit.estimate} if audit.estimate else {}),
    }, indent=2), file=args.result)
    return result.exit_code


def _add_rescore_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.rescore.rescoring import METRICS, RescoreOptions

    d = RescoreOptions()
    p.add_argument("--dev", required=True, help="dev N-best list (JSONL, Parquet or ESPnet JSON): weights are tuned here")
    p.add_argument("--test", required=True, help="test N-best list: the tuned weights are applied here")
    p.add_argument("--dev-refs", default=None, help="references of the dev set, if not in the N-best file (utt_id, ref)")
    p.add_argument("--test-refs", default=None, help="references of the test set, if not in the N-best file")
    _add_model_arguments(p, maskless=True)
    p.add_argument("--method", choices=("pll", "unmasked"), default="pll",
                   help="the masked LM's score of a hypothesis: its PLL (default), or one pass of the unmasked text "
                   "(as `dscore score --method unmasked`); --maskless DIR uses a student instead")
    p.add_argument("--causal-model", default=None, help="also interpolate a causal LM (log P with its BOS/EOS)")
    p.add_argument("--metric", choices=METRICS, default=d.metric, help="wer (ASR, minimised) or bleu (MT, maximised)")
    p.add_argument("--mlm-alpha", type=float, default=d.mlm_alpha,
                   help="GNMT length-penalty exponent on the PLL (default: 0 for wer; searched on dev for bleu)")
    p.add_argument("--causal-alpha", type=float, default=d.causal_alpha,
                   help="GNMT length-penalty exponent on log P (default: 0 for wer; searched on dev for bleu)")
    p.add_argument("--seq-alpha", type=float, default=d.seq_alpha,
                   help="GNMT normalisation of the sequence model's score (0 off; 0.6 for NMT)")
    p.add_argument("--lambda-max", type=float, default=d.lambda_max,
                   help=f"top of the first LM-weight grid (default {d.lambda_max:g}; doubled while the optimum sits there)")
    p.add_argument("--lambda-limit", type=float, default=d.lambda_limit,
                   help=f"largest LM weight the grid may be extended to (default {d.lambda_limit:g})")
    p.add_argument("--bleu-tokenize", default=d.bleu_tokenize, help="sacrebleu tokenizer ('none' for tokenised text)")
    p.add_argument("--append", default="", help="text appended to each hypothesis before LM scoring ('.' for ASR)")


def _rescore(args: argparse.Namespace) -> int:
    from ..workflows.rescore.run import RescoreInputs, rescore_nbest
    from ..workflows.rescore.rescoring import RescoreOptions

    inputs = RescoreInputs(args.dev, args.test, args.output, args.dev_refs, args.test_refs, args.append, args.shard_rows)
    options = RescoreOptions(metric=args.metric, mlm_alpha=args.mlm_alpha, causal_alpha=args.causal_alpha,
                             seq_alpha=args.seq_alpha, lambda_max=args.lambda_max, lambda_limit=args.lambda_limit,
                             bleu_tokenize=args.bleu_tokenize)
    scoring = ScoringOptions(args.variant, args.batch_tokens)
    causal = _model(args, args.causal_model) if args.causal_model else None
    student = _student(args)
    if student and args.method != "pll":
        raise UserError(f"--maskless DIR scores with a student; it does not go with --method {args.method}")
    result = rescore_nbest(inputs, _model(args, student), causal, scoring, options, _ray_options(args), args.overwrite,
                           method="maskless" if student else args.method)
    keys = ("metric", "lambda", "gamma", "mlm_alpha", "causal_alpha", "dev", "test", "edges", "scoring")
    print(json.dumps({k: result.report[k] for k in keys}, indent=2), file=args.result)
    return 0


def _add_joints_arguments(p: argparse.ArgumentParser) -> None:
    from ..engine.joint_stats import PIVOTS, JointOptions
    from ..workflows.joints import SCHEMES

    d = JointOptions()
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="a text corpus (pairs drawn by --scheme) or one JSONL of given pairs (text, positions: [a, b])")
    # No --variant: the paper's conditionals mask exactly the pair (`conditionals.py`), not a PLL's words.
    _add_model_arguments(p, shard_rows=50, variant=False)
    p.add_argument("--text-column", default="text", help="column holding the text of a corpus (default: text)")
    p.add_argument("--scheme", choices=SCHEMES, default="random",
                   help="two tokens uniformly at random, or two adjacent tokens (ignored for given pairs)")
    p.add_argument("--examples", type=int, default=1000, help="sentences drawn from the corpus (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawing of sentences and positions")
    p.add_argument("--ag-iterations", type=int, default=d.ag_iterations, help="Arnold-Gokhale iterations (default 50)")
    p.add_argument("--hcb-pivot", choices=PIVOTS, default=d.pivot,
                   help="HCB pivot: mode of the MLM joint (default), mask, the gold token, or the unary mode")
    p.add_argument("--top-k", type=int, default=None,
                   help="approximation: restrict V to the gold tokens and the top-k of each conditional")


def _joints(args: argparse.Namespace) -> int:
    from ..engine.joint_stats import JointOptions
    from ..workflows.joints import JointsInputs, pairwise_joints

    inputs = JointsInputs(tuple(args.inputs), args.output, args.scheme, args.examples, args.seed, args.text_column,
                          args.shard_rows)
    options = JointOptions(pivot=args.hcb_pivot, ag_iterations=args.ag_iterations)
    summary = pairwise_joints(inputs, _model(args), options, args.batch_tokens, args.top_k, _ray_options(args),
                              args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _add_infill_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.infill import DECODERS, ORDERS, InfillOptions

    d = InfillOptions()
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="texts with the model's mask token once per token to fill (files, folders, globs, URIs)")
    _add_model_arguments(p, shard_rows=100, variant=False)
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    _add_id_arguments(p)
    p.add_argument("--answer-column", default=d.answer_column,
                   help="column with the true fill, tokens separated by spaces, for accuracy and BLEU (optional)")
    p.add_argument("--decoder", choices=DECODERS, default=d.decoder,
                   help="standard or hcb beam search, exact enumeration, or a sampling baseline (default standard)")
    p.add_argument("--order", choices=ORDERS, default=d.order, help="fill order (default l2r)")
    p.add_argument("--beam", type=int, default=d.beam, help=f"beam width, or chains of a sampler (default {d.beam})")
    p.add_argument("--top", type=int, default=d.top, help="fills written per row, best first (default: --beam of them)")
    p.add_argument("--vocab-restrict", default=None,
                   help="the only tokens a fill may use, space-separated, as the tokenizer writes them or as "
                   'they read (e.g. the 20 amino acids "A C D ...")')
    p.add_argument("--pivot", default=None, help="HCB pivot token (default: the mask token)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="temperature sampler's T (default 1)")
    p.add_argument("--sample-top-k", type=int, default=d.sample_top_k,
                   help=f"top-k sampler's k (default {d.sample_top_k})")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"nucleus sampler's p (default {d.top_p})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the samplers (with each row's id)")
    p.add_argument("--max-masks", type=int, default=d.max_masks,
                   help=f"rows with more mask tokens are error rows (default {d.max_masks})")
    p.add_argument("--exact-limit", type=int, default=d.exact_limit,
                   help=f"most fills `exact` enumerates per row, |V|^masks (default {d.exact_limit:,})")
    p.add_argument("--rescore-pll", action="store_true", help="also write the PLL of each written fill")


def _infill(args: argparse.Namespace) -> int:
    from ..workflows.infill import InfillOptions, infill

    options = InfillOptions(
        args.decoder, args.order, args.beam, args.top,
        tuple(args.vocab_restrict.split()) if args.vocab_restrict else None, args.pivot, args.temperature,
        args.sample_top_k, args.top_p, args.seed, args.max_masks, args.exact_limit, args.rescore_pll, args.answer_column,
    )
    config = RunConfig(InputSpec(tuple(args.inputs), args.text_column, args.id_column, args.shard_rows,
                                 allow_duplicate_ids=args.allow_duplicate_ids), _model(args),
                       ScoringOptions(batch_tokens=args.batch_tokens), args.output)
    summary = infill(config, options, _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _add_sample_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.sample import ENERGIES, ORDERS, SAMPLERS, STARTS, SampleOptions

    d = SampleOptions()
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="texts with the model's mask token at the positions to sample (or any text with --free-all)")
    _add_model_arguments(p, shard_rows=50, variant=False)
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    _add_id_arguments(p)
    p.add_argument("--answer-column", default=d.answer_column,
                   help="column with the true tokens at the sampled positions, space-separated (optional)")
    p.add_argument("--energy", choices=ENERGIES, default=d.energy,
                   help="raw: -sum of masked logits; norm: -PLL (default norm)")
    p.add_argument("--sampler", choices=SAMPLERS, default=d.sampler,
                   help="mh (one position), block-mh (--block positions), gibbs (always accepts: a baseline)")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"recorded epochs after burn-in (default {d.epochs})")
    p.add_argument("--burn-in", type=int, default=d.burn_in, help="unrecorded epochs first (default 0)")
    p.add_argument("--chains", type=int, default=d.chains, help="chains per input row (default 1)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (with each row's id and chain number)")
    p.add_argument("--free-all", action="store_true", help="sample every position, starting from the given text")
    p.add_argument("--block", type=int, default=d.block, help="positions per block-mh proposal (default 1)")
    p.add_argument("--block-decay", type=int, default=d.block_decay,
                   help="block size shrinks by this per epoch, down to 1 (default 0)")
    p.add_argument("--proposal-temperature", type=float, default=d.proposal_temperature,
                   help="temperature of the MLM proposal (default 1)")
    p.add_argument("--target-temperature", type=float, default=d.target_temperature,
                   help="T of the target exp(-E/T) (default 1)")
    p.add_argument("--anneal", type=float, default=d.anneal,
                   help="subtracted from the target temperature each epoch, for mode finding (default 0)")
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus of the proposal (default 1: off)")
    p.add_argument("--record-every", type=int, default=d.record_every, help="record every N epochs (default 1)")
    p.add_argument("--order", choices=ORDERS, default=d.order, help="positions in order, or a seeded permutation")
    p.add_argument("--start", choices=STARTS, default=d.start,
                   help="auto: warm (greedy fill) where mask tokens are sampled, else as given")
    p.add_argument("--forced-accept", type=int, default=d.forced_accept,
                   help="accept every proposal of the first N epochs (Goyal et al.'s trick after a warm start; "
                   "keep N within --burn-in) (default 0)")
    p.add_argument("--vocab-restrict", default=None,
                   help="the only tokens a proposal may use, space-separated (as in dscore infill)")


def _sample(args: argparse.Namespace) -> int:
    from ..workflows.sample import SampleOptions, sample

    options = SampleOptions(
        args.energy, args.sampler, args.epochs, args.burn_in, args.chains, args.seed, args.free_all, args.block,
        args.block_decay, args.proposal_temperature, args.target_temperature, args.anneal, args.top_p,
        args.record_every, args.order, args.start,
        tuple(args.vocab_restrict.split()) if args.vocab_restrict else None, args.answer_column, args.forced_accept,
    )
    config = RunConfig(InputSpec(tuple(args.inputs), args.text_column, args.id_column, args.shard_rows,
                                 allow_duplicate_ids=args.allow_duplicate_ids), _model(args),
                       ScoringOptions(batch_tokens=args.batch_tokens), args.output)
    summary = sample(config, options, _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _add_train_arguments(p: argparse.ArgumentParser, lr: float) -> None:
    """What every training command takes: the model, the folder, the schedule and where it runs; `lr` is
    the command's default learning rate."""
    from ..workflows.train.run import TrainOptions, TrainResources

    d, r = TrainOptions(), TrainResources()
    p.add_argument("--model", required=True, help="the masked LM to start from (local folder or Hub id)")
    p.add_argument("--output", required=True,
                   help="training folder (local or shared path): checkpoints, metrics.jsonl, report.json, the model")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training split (default {d.epochs})")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps instead of --epochs")
    p.add_argument("--lr", type=float, default=lr, help=f"peak AdamW learning rate, warmed up and decayed linearly (default {lr:g})")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help=f"sequences per step over all workers (default {d.batch_size})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the split, the batches and the masks")
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help=f"training sequences longer than this (tokens, specials included) are left out (default {d.max_length})")
    p.add_argument("--heldout", type=float, default=d.heldout,
                   help=f"share of the rows kept out of training for the report (default {d.heldout})")
    p.add_argument("--batch-tokens", type=int, default=None, help="token budget of the evaluation's forward passes")
    p.add_argument("--revision", default=None, help="model revision (Hub models)")
    p.add_argument("--trust-remote-code", action="store_true", help="let transformers run code shipped with the model")
    p.add_argument("--overwrite", action="store_true", help="start again in a folder that holds a different training run")
    ray = p.add_argument_group("Ray Train", "training runs on Ray Train: an embedded local Ray unless a cluster is given")
    ray.add_argument("--ray", action="store_true", help="accepted as in the scoring commands: training always runs on Ray")
    ray.add_argument("--num-workers", type=int, default=r.num_workers, help="data-parallel workers (default 1)")
    ray.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    ray.add_argument("--cpus-per-worker", type=float, default=r.cpus_per_worker,
                     help=f"CPUs of each worker (default {r.cpus_per_worker:g})")
    ray.add_argument("--checkpoint-every", type=int, default=r.checkpoint_every,
                     help=f"steps between checkpoints (default {r.checkpoint_every}); a rerun continues from the latest")
    ray.add_argument("--address", default=None,
                     help="Ray cluster to join: 'auto', host:port or ray://...; default $RAY_ADDRESS, else embedded")


def _train_options(args: argparse.Namespace) -> tuple:
    from ..workflows.train.run import TrainOptions, TrainResources

    options = TrainOptions(args.epochs, args.steps, args.lr, args.batch_size, args.seed, args.max_length, args.heldout)
    resources = TrainResources(args.num_workers, args.use_gpu, args.cpus_per_worker, args.checkpoint_every,
                               args.address)
    return options, resources


def _train_maskless(args: argparse.Namespace) -> int:
    from ..workflows.train.maskless import NBest, StudentOptions, train_maskless

    options, resources = _train_options(args)
    model = ModelSpec(args.model, args.revision, trust_remote_code=args.trust_remote_code)
    student = StudentOptions(args.target, args.parent_separator, args.freeze_layers, args.token_weight)
    if (args.nbest_dev is None) != (args.nbest_test is None):
        raise UserError("--nbest-dev and --nbest-test go together: weights are tuned on dev and applied to test")
    nbest = NBest(args.nbest_dev, args.nbest_test, args.nbest_metric) if args.nbest_dev else None
    report = train_maskless(args.teacher, model, args.output, options, resources, args.overwrite, args.batch_tokens,
                            student, nbest, args.speed_sentences)
    print(json.dumps(report, indent=2), file=args.result)
    return 0


def _train_pmlm(args: argparse.Namespace) -> int:
    from ..workflows.train.pmlm import read_corpus, train_pmlm

    options, resources = _train_options(args)
    model = ModelSpec(args.model, args.revision, trust_remote_code=args.trust_remote_code)
    corpus = read_corpus(tuple(args.data), args.text_column, args.id_column, args.split_chars,
                         args.allow_duplicate_ids)
    report = train_pmlm(corpus, model, args.output, options, resources, args.overwrite, args.batch_tokens, args.orders)
    print(json.dumps(report, indent=2), file=args.result)
    return 0


def _add_generate_arguments(p: argparse.ArgumentParser) -> None:
    from ..workflows.generate import ORDERS, GenerateOptions

    d = GenerateOptions()
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="prompts: texts with the model's mask token at each token to generate (the other tokens "
                   "stay); or none, with --length")
    _add_model_arguments(p, shard_rows=100, variant=False)
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    _add_id_arguments(p)
    p.add_argument("--length", type=int, default=None, help="no INPUTS: generate sequences of this many tokens")
    p.add_argument("--num-sequences", type=int, default=d.sequences,
                   help="sequences per prompt; with --length, how many sequences (default 1)")
    p.add_argument("--order", choices=ORDERS, default=d.order,
                   help="fill order: random (default; seeded per sequence), l2r, r2l, or given per row")
    p.add_argument("--order-column", default=d.order_column,
                   help="with --order given: the column listing the masks' indices (0 .. k-1, in reading order) in "
                   'fill order, as a JSON list or "2 0 1" (default: fill_order, as the output writes it)')
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help="sampling temperature; 0: greedy, the most probable token at each step (default 1)")
    p.add_argument("--top-k", type=int, default=d.top_k, help="sample among the k most probable tokens (default 0: off)")
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus sampling's p (default 1: off)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the orders and samples (with each row's id)")
    p.add_argument("--vocab-restrict", default=None,
                   help="the only tokens that may be generated, space-separated (as in dscore infill)")


def _generate(args: argparse.Namespace) -> int:
    from ..workflows.generate import GenerateInputs, GenerateOptions, generate

    options = GenerateOptions(
        args.order, args.num_sequences, args.temperature, args.top_k, args.top_p, args.seed,
        tuple(args.vocab_restrict.split()) if args.vocab_restrict else None, args.length, args.order_column,
    )
    inputs = GenerateInputs(tuple(args.inputs), args.output, args.text_column, args.id_column, args.shard_rows,
                            args.batch_tokens, args.allow_duplicate_ids)
    summary = generate(inputs, _model(args), options, _ray_options(args), overwrite=args.overwrite)
    print(json.dumps(summary, indent=2), file=args.result)
    return 0


def _fetch_model(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..offline.models import fetch_model

    print(fetch_model(args.name, Path(args.cache) if args.cache else None), file=args.result)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from ..workflows.verify import report, verify_folder

    result = verify_folder(args.folder)
    print(report(result), file=args.result)
    return 0 if result.ok else 1


def _submit(args: argparse.Namespace) -> int:
    from ..workflows.submit import Submission, submit

    words = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    return submit(Submission(tuple(words), args.address, args.working_dir), args.result)


def build_parser() -> argparse.ArgumentParser:
    from ..engine.model_files import TARGETS
    from ..offline.models import MODELS
    from ..workflows.train.maskless import LR as MASKLESS_LR, SPEED_SENTENCES, StudentOptions
    from ..workflows.train.pmlm import LR as PMLM_LR

    parser = argparse.ArgumentParser(prog="dscore", description="Masked-LM scoring: PLL and pseudo-perplexity")
    _add_verbose(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="PLL of every sentence, Parquet out, corpus PPPL in summary.json")
    _add_score_arguments(score, maskless=True)
    _add_chain_arguments(score)
    score.set_defaults(func=_score_by_method)
    rescore = commands.add_parser(
        "rescore", help="rescore ASR/MT N-best lists with a masked LM (and a causal LM), tuned on dev")
    _add_rescore_arguments(rescore)
    rescore.set_defaults(func=_rescore)
    joints = commands.add_parser(
        "joints", help="pairwise joints (MLM, MRF, MRF-L, HCB, AG) from MLM conditionals, with U-PPL, P-PPL, A-KL, G-KL")
    _add_joints_arguments(joints)
    joints.set_defaults(func=_joints)
    infill = commands.add_parser(
        "infill", help="fill masked spans: standard or HCB beam search, sampling baselines, exact search",
        description="Rows in DIR/rows/*.parquet: id, text, decoder, order, beams (tokens, text, score; best "
        "first), best, answer, n_masks, rank, correct_tokens, status, error, model. Exit codes: 0 done, "
        "1 rows lost, 2 bad input or options.")
    _add_infill_arguments(infill)
    infill.set_defaults(func=_infill)
    sample = commands.add_parser(
        "sample", help="sample from an MLM's energy: Metropolis-Hastings with MLM proposals (and Gibbs)",
        description="Rows in DIR/rows/*.parquet, one per chain per recorded epoch: id, chain, epoch, text, "
        "sampled, energy_raw, energy_norm, proposals, accepted, novel, target_temperature, answer, correct, n_sampled, "
        "status, error, model. Exit codes: 0 done, 1 rows lost, 2 bad input or options.")
    _add_sample_arguments(sample)
    sample.set_defaults(func=_sample)
    generate = commands.add_parser(
        "generate", help="generate in any order with a masked LM (u-PMLM Algorithm 1): greedy or sampled, constrained "
        "by the prompt's tokens",
        description="Rows in DIR/rows/*.parquet, one per generated sequence: id, sequence, prompt, text, tokens, "
        "fill_order, log_likelihood (chain rule along fill_order, natural log), n_tokens, order, status, error, "
        "model. Exit codes: 0 done, 1 rows lost, 2 bad input or options.")
    _add_generate_arguments(generate)
    generate.set_defaults(func=_generate)
    audit = commands.add_parser(
        "audit", help="score a corpus snapshot and audit it: PPPL per partition, outliers, baseline",
        description="Scores in this process, or on Ray with --ray or --address (as `dscore score`). Exit codes: 0 pass (every scope shows no change or an improvement, or no baseline), "
        "3 a regression against the baseline, 5 insufficient data (some scope's interval cannot tell; "
        "--accept-insufficient turns it into a pass), 4 the baseline was scored by another model (PPPL not "
        "compared), 1 rows lost, 2 bad input or options.",
    )
    _add_score_arguments(audit, per_token_flag=False, maskless=True)
    _add_audit_arguments(audit)
    audit.set_defaults(func=_audit)
    verify = commands.add_parser(
        "verify", help="check an output folder: every planned shard done, markers against files, ids once, "
        "summary there and agreeing, no leftovers",
        description="Prints one line per problem, per missing part and per thing it could not check, then OK, "
        "INCOMPLETE (rerun the same command to finish) or FAILED (damaged). Folders of rescore, joints and train "
        "are verified through the runs inside them. Exit codes: 0 complete and sound, 1 incomplete or damaged, "
        "2 not a dscore output folder.",
    )
    verify.add_argument("folder", metavar="DIR", help="the command's --output folder (local path or URI)")
    verify.set_defaults(func=_verify)
    train = commands.add_parser("train", help="training jobs on Ray Train: u-PMLM, maskless scorers")
    trainers = train.add_subparsers(dest="trainer", required=True)
    maskless = trainers.add_parser(
        "maskless", help="distil a PLL run into a student that predicts each PLL in one forward pass",
        description="A student that predicts each PLL in one forward pass of the unmasked sentence: the MLM's encoder "
        "and a head over [CLS] regressed on the PLL (--target sentence, Salazar et al. 2020, sec. 2.2), or the MLM "
        "itself fitted per position to the teacher's terms or conditionals (--target token|distribution). "
        "DIR/report.json and report.md: held-out agreement with the teacher beside the unmasked and length-only "
        "baselines, mutant-minus-parent differences, N-best rescoring, speed-up over the PLL. Score with "
        "`dscore score --maskless DIR`. Exit codes: 0 done, 1 the run failed (rerun the command to continue from "
        "its latest checkpoint), 2 bad input or options.")
    maskless.add_argument("--teacher", required=True, metavar="SCORES_DIR",
                          help="the --output folder of a `dscore score` run: its rows' PLLs are the targets (with "
                          "--per-token for --target token, and --conditionals K too for --target distribution)")
    student = StudentOptions()
    maskless.add_argument("--target", choices=TARGETS, default=student.target,
                          help="sentence: regress the PLL from the first token (Salazar et al.); token: regress each "
                          "token's log q(w_t) on the teacher's term; distribution: fit each position's distribution "
                          f"to the teacher's conditional by KL (word-level distillation) (default {student.target})")
    maskless.add_argument("--parent-separator", default=None, metavar="SEP",
                          help="a row id P<SEP>... is a variant (a point mutant) of row P: both stay on the same side "
                          "of the held-out split, and the report compares their differences (default: none)")
    maskless.add_argument("--freeze-layers", type=int, default=student.freeze_layers, metavar="N",
                          help="keep the embeddings and the N lowest transformer layers as they are (default 0)")
    maskless.add_argument("--token-weight", type=float, default=student.token_weight,
                          help="distribution: weight of the per-token squared error beside the KL "
                          f"(default {student.token_weight:g})")
    maskless.add_argument("--nbest-dev", default=None, help="an N-best list to tune rescoring weights on (as "
                          "`dscore rescore --dev`): the report rescores it with teacher, student and unmasked")
    maskless.add_argument("--nbest-test", default=None, help="the N-best list the tuned weights are applied to")
    maskless.add_argument("--nbest-metric", choices=("wer", "bleu"), default="wer", help="rescoring metric (default wer)")
    maskless.add_argument("--speed-sentences", type=int, default=SPEED_SENTENCES, metavar="N",
                          help=f"held-out rows the student and the PLL engine are timed on (default {SPEED_SENTENCES})")
    _add_train_arguments(maskless, lr=MASKLESS_LR)
    maskless.set_defaults(func=_train_maskless)
    pmlm = trainers.add_parser(
        "pmlm", help="continue training a masked LM with the u-PMLM objective (masking ratio ~ U(0, 1))",
        description="Liao et al. (2020): per sequence a masking ratio r ~ U(0, 1], that share of its tokens masked, "
        "cross-entropy on them. DIR is a model folder (`dscore score --model DIR`); DIR/report.json: held-out "
        "chain-rule perplexity, left-to-right and in random orders, before and after. Exit codes: 0 done, "
        "1 the run failed (rerun the command to continue from its latest checkpoint), 2 bad input or options.")
    pmlm.add_argument("--data", required=True, nargs="+", metavar="CORPUS",
                      help="training texts: files, folders or globs as `dscore score` reads them")
    pmlm.add_argument("--text-column", default="text", help="column or JSON field holding the text (default: text)")
    _add_id_arguments(pmlm, "column or JSON field holding a row id, which the held-out split hashes (default: "
                      "file:line)")
    pmlm.add_argument("--split-chars", action="store_true",
                      help="a space between characters before tokenising (per-residue models; see dscore score)")
    pmlm.add_argument("--orders", type=int, default=1,
                      help="random orders per held-out row for the random-order perplexity (default 1)")
    _add_train_arguments(pmlm, lr=PMLM_LR)
    pmlm.set_defaults(func=_train_pmlm)
    submit = commands.add_parser(
        "submit", help="run a dscore command or jobs/ script as a Ray job; exits with its exit code",
        description="Submits through Ray's job SDK (token auth from $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or "
        "~/.ray/auth_token), writes the job's log to standard output as it comes, and exits with the "
        "entrypoint's own code (0 pass, 3 regression, 5 insufficient data, 2 bad input, ...), which `ray job "
        "submit` does not. Exit codes: the entrypoint's; 2 no job server answers or it refuses the job; 1 the "
        "job ended without a code of its own (stopped, its driver lost) or the job server was lost meanwhile.")
    submit.add_argument("--address", default=None,
                        help="the job server, http://HEAD:8265 (default $RAY_API_SERVER_ADDRESS, then $RAY_ADDRESS)")
    submit.add_argument("--working-dir", default=None, metavar="DIR",
                        help="folder uploaded as the job's working directory and put on its PYTHONPATH (`.` for "
                        "this repository, which jobs/ scripts need where the package is not installed)")
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="what the job runs: `python jobs/pppl_audit.py --input ...` or `dscore audit ... --ray`")
    submit.set_defaults(func=_submit)
    fetch = commands.add_parser("fetch-model", help="download and convert an offline model; prints its folder")
    fetch.add_argument("name", choices=sorted(MODELS))
    fetch.add_argument("--cache", default=None, help="cache folder (default: $DSCORE_CACHE or ~/.cache/distributed-scoring)")
    fetch.set_defaults(func=_fetch_model)
    return parser


def job_main(command: str, argv: Sequence[str] | None = None, inputs: bool = True) -> int:
    """`ray job submit` entry points (jobs/): the run goes through Ray, joining the cluster that
    RAY_ADDRESS names inside a job; with `inputs`, `--input` flags (repeatable) become its inputs.

    A relative `--output` is refused: inside a job it would name a folder in the job's temporary working
    directory, a different one on every node, deleted when the job ends.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if inputs:
        parser = argparse.ArgumentParser(prog=f"jobs: dscore {command}", add_help=False)
        parser.add_argument("--input", action="append", required=True, help="file, folder, glob or URI (repeatable)")
        args, rest = parser.parse_known_args(argv)
        argv = [*args.input, *rest]
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--output")
    given = output.parse_known_args(argv)[0].output
    if given and "://" not in given and not os.path.isabs(given):
        print(f"dscore: error: --output {given!r} is relative; in a Ray job it would land in the job's temporary "
              "working directory on each node: pass an absolute path on storage every node shares, or an "
              "s3:// / gs:// URI", file=sys.stderr)
        return 2
    return main([command, *argv, "--ray"])


def _one_line(exc: Exception) -> str:
    """The message on one line: a library's message quoted in ours (transformers', pyarrow's) may span several."""
    return re.sub(r"\s*\n\s*", " ", str(exc).strip())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    quiet_transformers()
    os.environ.update(thread_env())  # before torch starts: OpenMP reads its wait policy once
    # Standard output carries the command's result alone (JSON that scripts parse); while a command runs,
    # anything else printed there (Ray streams its workers' and raylets' messages to stdout) goes to stderr.
    args.result = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            return args.func(args)
        except UserError as exc:
            print(f"dscore: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        except DataLossError as exc:
            print(f"dscore: incomplete: {_one_line(exc)}", file=sys.stderr)
            return 1
