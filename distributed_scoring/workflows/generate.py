"""`dscore generate`: u-PMLM generation in any order for every prompt, then a summary.

The prompts are the input rows (texts with mask tokens), or with `--length N --num-sequences M`, M
prompts of N mask tokens written into the output folder (`prompts/<digest>.parquet`: the same command
writes the same file once, so a rerun resumes). The rows go through the shared shard pipeline
(resumable, in this process or on Ray). `summary.json` counts the rows and gives the generated tokens'
perplexity under the model along their own orders, exp(-sum log_likelihood / sum n_tokens), and the
share of distinct texts among the ok rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ..errors import UserError
from ..io import schema as S
from ..io.claim import Claim, claim
from ..io.output import fingerprint
from ..io.storage import join
from ..measures import pppl
from ..options import check_bounds
from ..pipeline.memory import ROW_BYTES, MemoryEstimate, check_memory, text_tokens
from ..pipeline.runner import Finished, run
from ..pipeline.workload import Workload
from ..workloads.generate import (  # GenerateOptions: what the CLI builds a run from
    LOG_LIKELIHOOD,
    GenerateOptions,
    generate_workload,
    memory_estimate,
)
from ..workloads.infill import allowed_tokens

__all__ = ["GenerateInputs", "GenerateOptions", "generate"]

PROMPTS_DIR = "prompts"


@dataclass(frozen=True)
class GenerateInputs:
    """Where the prompts come from (files, folders, globs, URIs; none with `GenerateOptions.length`) and
    where the rows go."""

    paths: tuple[str, ...]
    output: str
    text_column: str = "text"
    id_column: str | None = None
    shard_rows: int = 100
    batch_tokens: int | None = None
    allow_duplicate_ids: bool = False

    def __post_init__(self) -> None:  # before --length's prompts are written
        check_bounds("--shard-rows", self.shard_rows, 1)
        check_bounds("--batch-tokens", self.batch_tokens, 1)


def generate(
    inputs: GenerateInputs,
    model: ModelSpec,
    options: GenerateOptions,
    ray: RayOptions | None = None,
    overwrite: bool = False,
) -> dict:
    """Generate every prompt's sequences; returns the summary (also written to summary.json).

    The tokenizer is loaded here first, so a model or a --vocab-restrict token that cannot be used
    stops the run before any file is written.
    """
    mask_token = _checked_mask_token(inputs, model, options)
    extra = (options.order_column,) if options.order == "given" else ()
    workload = generate_workload(model, options, inputs.batch_tokens)
    with claim(inputs.output, inputs.paths, [model.name]) as folder:
        prompts = None if options.length is None else _prompts(mask_token, options)
        paths = inputs.paths if prompts is None else (join(folder.out.location, prompts[0]),)
        config = RunConfig(
            InputSpec(
                paths,
                inputs.text_column,
                inputs.id_column if prompts is None else S.ID,
                inputs.shard_rows,
                extra_columns=extra,
                allow_duplicate_ids=inputs.allow_duplicate_ids,
            ),
            model,
            ScoringOptions(batch_tokens=inputs.batch_tokens),
            inputs.output,
        )
        if prompts is not None:
            _write_prompts(folder, *prompts, config, workload, overwrite)
        return run(config, workload, ray, overwrite, folder=folder, summarise=lambda done: summarize(done, options))


def _checked_mask_token(inputs: GenerateInputs, model: ModelSpec, options: GenerateOptions) -> str:
    """The model's mask token, once everything the tokenizer can tell is checked (the prompts or --length,
    the mask token, --vocab-restrict, the length against the model's maximum, the memory a shard needs)."""
    from ..engine.model_files import load_tokenizer

    if bool(inputs.paths) == (options.length is not None):
        raise UserError("give either INPUTS (texts with mask tokens) or --length N, not both or neither")
    tokenizer, max_length = load_tokenizer(model)
    if tokenizer.mask_token is None:
        raise UserError(f"{model.name!r} has no mask token, so it cannot generate in any order")
    allowed = allowed_tokens(tokenizer, len(tokenizer), options.vocab_restrict)
    # (a --length over the maximum is refused before its masks are tokenised: it may be absurdly long)
    if options.length is not None and (
        options.length > max_length or len(tokenizer(tokenizer.mask_token * options.length)["input_ids"]) > max_length
    ):
        raise UserError(
            f"--length {options.length} with the special tokens is over the model's maximum of {max_length} tokens"
        )
    tokens = text_tokens(max_length) if options.length is None else options.length + 2
    if options.length is not None:
        check_memory("dscore generate", _prompts_memory(options, tokenizer.mask_token))
    check_memory("dscore generate", memory_estimate(options, inputs.shard_rows, tokens, int(allowed.sum())))
    return tokenizer.mask_token


def _prompts_memory(options: GenerateOptions, mask_token: str) -> MemoryEstimate:
    """The prompts of --length, one table built on the driver before it is written."""
    return MemoryEstimate(
        options.sequences * (ROW_BYTES + options.length * len(mask_token)),
        f"the {options.sequences:,} prompts of --length {options.length}",
        "--num-sequences",
    )


def _prompts(mask_token: str, options: GenerateOptions) -> tuple[str, pa.Table]:
    """(file name in the folder, table): `options.sequences` prompts of `options.length` mask tokens (joined
    without spaces: every family's tokenizer reads them as that many masks) with ids, named by content."""
    width = len(str(options.sequences - 1))
    table = pa.table(
        {
            S.ID: [f"{i:0{width}d}" for i in range(options.sequences)],
            S.TEXT: [mask_token * options.length] * options.sequences,
        }
    )
    digest = hashlib.sha256(f"{options.length}/{options.sequences}/{mask_token}".encode()).hexdigest()[:16]
    return f"{PROMPTS_DIR}/{digest}.parquet", table


def _write_prompts(
    folder: Claim, name: str, table: pa.Table, config: RunConfig, workload: Workload, overwrite: bool
) -> None:
    """Write the prompts into the folder once (a rerun finds the same file unchanged), after the folder has
    admitted the run on all it records but the shard plan, which needs the file: a folder of another run
    gets no prompts."""
    known = fingerprint(workload.name, workload.options, config, ())
    folder.admit({k: v for k, v in known.items() if k != "plan"}, overwrite, partial=True)
    if folder.out.exists(folder.out.path(name)):
        folder.record(name)
        return
    with folder.out.writing():
        folder.write_table(name, table)


def summarize(done: Finished, options: GenerateOptions) -> dict:
    """The figures of `summary.json` from the finished run's rows (see the module docstring), and its model."""
    table = done.out.read_rows([S.STATUS, S.TEXT, LOG_LIKELIHOOD, S.N_TOKENS])
    ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK))
    total, tokens = float(pc.sum(ok[LOG_LIKELIHOOD]).as_py() or 0.0), int(pc.sum(ok[S.N_TOKENS]).as_py() or 0)
    return {
        "rows": table.num_rows,
        "ok": ok.num_rows,
        "errors": table.num_rows - ok.num_rows,
        "order": options.order,
        "temperature": options.temperature,
        "top_k": options.top_k,
        "top_p": options.top_p,
        "seed": options.seed,
        "length": options.length,
        "sequences": options.sequences,
        "n_tokens": tokens,
        "sum_log_likelihood": total,
        "ppl_token": pppl(total, tokens),
        "distinct_texts": len(set(ok[S.TEXT].to_pylist())) / ok.num_rows if ok.num_rows else None,
        "sequences_per_s": done.rows_now / done.seconds if done.seconds > 0 and done.rows_now else None,
        "model": done.config.model.name,
    }
