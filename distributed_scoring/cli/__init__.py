"""`dscore`: thin commands that parse, call one library function and print its result.

A command is one module of this package exposing `add_arguments(parser)` and `run(args) -> int` (the exit
code), and one entry in COMMANDS; flags that several commands take are declared once in `common`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from types import SimpleNamespace
from typing import Sequence

from ..cpus import thread_env
from ..errors import DataLossError, UserError, error_reason, storage_cause
from ..quiet import quiet_transformers
from ..stopping import Stopped, stopping_on_signals
from . import audit, fetch_model, generate, infill, job, joints, rescore, sample, score, submit, train, variants, verify
from .common import Command, add_commands, add_verbose, dispatch, environment, storage_environment

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # every command's log lines on standard error

# The commands in the order of `dscore --help`: (name, its line there, its own --help text, its module).
COMMANDS = (
    Command("score", "PLL of every sentence, Parquet out, corpus PPPL in summary.json", None, score),
    Command("rescore", "rescore ASR/MT N-best lists with a masked LM (and a causal LM), tuned on dev", None, rescore),
    Command(
        "joints",
        "pairwise joints (MLM, MRF, MRF-L, HCB, AG) from MLM conditionals, with U-PPL, P-PPL, A-KL, G-KL",
        None,
        joints,
    ),
    Command(
        "infill",
        "fill masked spans: standard or HCB beam search, sampling baselines, exact search",
        "Rows in DIR/rows/*.parquet: {columns} (beams best first). Exit codes: 0 done, 1 rows lost, 2 bad "
        "input or options.",
        infill,
        "infill",
    ),
    Command(
        "sample",
        "sample from an MLM's energy: Metropolis-Hastings with MLM proposals (and Gibbs)",
        "Rows in DIR/rows/*.parquet, one per chain per recorded epoch: {columns}. Exit codes: 0 done, 1 rows "
        "lost, 2 bad input or options.",
        sample,
        "sample",
    ),
    Command(
        "generate",
        "generate in any order with a masked LM (u-PMLM Algorithm 1): greedy or sampled, constrained "
        "by the prompt's tokens",
        "Rows in DIR/rows/*.parquet, one per generated sequence: {columns} (log_likelihood: the chain rule "
        "along fill_order, natural log). Exit codes: 0 done, 1 rows lost, 2 bad input or options.",
        generate,
        "generate",
    ),
    Command(
        "audit",
        "score a corpus snapshot and audit it: PPPL per partition, outliers, baseline",
        "Scores in this process, or on Ray with --ray or --address (as `dscore score`). Exit codes: 0 pass "
        "(every scope shows no change or an improvement, or no baseline), "
        "3 a regression against the baseline, 5 insufficient data (some scope's interval cannot tell; "
        "--accept-insufficient turns it into a pass), 4 the baseline was scored by another model (PPPL not "
        "compared), 1 rows lost, 2 bad input or options.",
        audit,
    ),
    Command(
        "verify",
        "check an output folder: every planned shard done, markers against files, ids once, "
        "summary there and agreeing, no leftovers",
        "Prints one line per problem, per missing part and per thing it could not check, then OK, "
        "INCOMPLETE (rerun the same command to finish) or FAILED (damaged). Folders of rescore, joints and train "
        "are verified through the runs inside them. Exit codes: 0 complete and sound, 1 incomplete or damaged, "
        "2 not a dscore output folder.",
        verify,
    ),
    Command(
        "variants",
        "protein variant effects of DMS tables (ProteinGym): wt-, masked-, mutant-marginal or PLL difference",
        "Writes DIR/variants.parquet (every input column, DMS_id, score, n_mutations, status, error), summary.json "
        "(forward_passes; per assay Spearman with DMS_score and AUC of DMS_score_bin, with bootstrap intervals), "
        "report.md and scatter.png. Exit codes: 0 done, 1 rows lost, 2 bad input or options.",
        variants,
    ),
    Command("train", "training jobs on Ray Train: u-PMLM, maskless scorers", None, train),
    Command(
        "submit",
        "run a dscore command or jobs/ script as a Ray job; exits with its exit code",
        "Submits through Ray's job SDK (token auth from $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or "
        "~/.ray/auth_token), writes the job's log to standard output as it comes, and exits with the "
        "entrypoint's own code (0 pass, 3 regression, 5 insufficient data, 2 bad input, ...), which `ray job "
        "submit` does not. Exit codes: the entrypoint's; 2 no job server answers or it refuses the job; 1 the "
        "job ended without a code of its own (stopped, its driver lost) or the job server was lost meanwhile.",
        submit,
    ),
    Command(
        "job",
        "run a command as a Ray job's entry point: `ray job submit -- dscore job score --input ...`",
        "Runs COMMAND through Ray, joining the cluster that RAY_ADDRESS names inside a job (as --ray does), "
        "with --input flags (repeatable) as its inputs. A relative --output is refused: inside a job it would "
        "land in the job's temporary working directory on each node. The jobs/ scripts do the same. Exit codes: "
        "COMMAND's.",
        SimpleNamespace(  # cli.job, given this registry
            add_arguments=lambda p: job.add_arguments(p, COMMANDS),
            run=lambda args: job.run(args, build_parser(), COMMANDS),
        ),
    ),
    Command("fetch-model", "download and convert an offline model; prints its folder", None, fetch_model),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dscore", description="Masked-LM scoring: PLL and pseudo-perplexity")
    add_verbose(parser)
    add_commands(parser, COMMANDS, dest="command")
    return parser


def job_main(command: str, argv: Sequence[str] | None = None) -> int:
    """The jobs/ scripts' entry: `dscore job COMMAND` with the script's arguments."""
    return main(["job", command, *(sys.argv[1:] if argv is None else argv)])


def _one_line(exc: Exception) -> str:
    """The message on one line: a library's message quoted in ours (transformers', pyarrow's) may span several."""
    return re.sub(r"\s*\n\s*", " ", str(exc).strip())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if getattr(args, "verbose", False):  # which object-store endpoint a run uses (io.storage)
        logging.getLogger("distributed_scoring.io.storage").setLevel(logging.DEBUG)
    quiet_transformers()
    os.environ.update(thread_env())  # before torch starts: OpenMP reads its wait policy once
    # Standard output carries the command's result alone (JSON that scripts parse); while a command runs,
    # anything else printed there (Ray streams its workers' and raylets' messages to stdout) goes to stderr.
    args.result = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            with environment(storage_environment(args)), stopping_on_signals():
                return dispatch(COMMANDS, args.command, args)
        except Stopped as stop:  # SIGTERM or Ctrl-C: the run unwound (lock released, Ray shut down)
            print(f"dscore: {stop.line()}", file=sys.stderr)
            return stop.exit_code
        except UserError as exc:
            print(f"dscore: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        except DataLossError as exc:
            print(f"dscore: incomplete: {_one_line(exc)}", file=sys.stderr)
            return 1
        except OSError as exc:  # storage that cannot be used before the run (a run's own become DataLossError)
            print(f"dscore: error: {storage_cause(exc)} ({_one_line(error_reason(exc))})", file=sys.stderr)
            return 2
