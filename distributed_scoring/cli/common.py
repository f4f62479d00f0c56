"""What several commands share, declared once: the input, model, output, Ray and device flags, the specs
built from them, the one way a command ends (its result on standard output, its exit code), and the
registry entries commands are added and run through."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import pkgutil
from types import ModuleType
from typing import Any, Iterable, Iterator, NamedTuple

from ..config import (
    DEVICES,
    DTYPES,
    STORAGE_RETRY_ENV,
    UNSAFE_LOCK_ENV,
    InputSpec,
    ModelSpec,
    RayOptions,
    RunConfig,
    ScoringOptions,
)
from ..errors import UserError
from ..options import check_bounds, flag_name, flagged

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def add_inputs(p: argparse.ArgumentParser, help: str, nargs: str = "+") -> None:
    """The INPUT positionals: files, folders, globs or URIs; `help` says what the command reads in them."""
    p.add_argument("inputs", nargs=nargs, metavar="INPUT", help=help)


def add_text_column(
    p: argparse.ArgumentParser, help: str = "column or JSON field holding the text (default: text)"
) -> None:
    p.add_argument("--text-column", default="text", help=help)


def add_id_arguments(
    p: argparse.ArgumentParser, meaning: str = "column or JSON field holding a row id (default: file:line)"
) -> None:
    p.add_argument("--id-column", default=None, help=f"{meaning}; ids must be unique")
    p.add_argument(
        "--allow-duplicate-ids",
        action="store_true",
        help="keep rows whose --id-column values repeat (refused otherwise, before any work); the rows "
        "then carry a `line` column (file:record) and are keyed by id and line",
    )


def add_corpus_arguments(
    p: argparse.ArgumentParser,
    inputs_help: str,
    nargs: str = "+",
    shard_rows: int = 1000,
    variant: bool = True,
    maskless: bool = False,
    fit_actors: bool = True,
) -> None:
    """The rows a command reads and the masked LM that reads them: INPUT..., the model flags, --text-column
    and the id flags, in the order of their --help."""
    add_inputs(p, inputs_help, nargs)
    add_model_arguments(p, shard_rows, variant, maskless, fit_actors)
    add_text_column(p)
    add_id_arguments(p)


def add_model_arguments(
    p: argparse.ArgumentParser,
    shard_rows: int = 1000,
    variant: bool = True,
    maskless: bool = False,
    fit_actors: bool = False,
) -> None:
    """Which masked LM, where its results go, and how it runs: shared by every scoring command.
    `variant`: the command computes PLLs, whose masking the variant chooses. `maskless`: a maskless
    student (`--maskless DIR`) may stand in for the masked LM's PLLs. `fit_actors`: --shard-rows left out
    is `shard_rows`, lowered on Ray to give every scoring actor a shard (`config.InputSpec.fit_actors`)."""
    p.add_argument(
        "--model",
        required=not maskless,
        help="local model folder or Hub id of a masked LM, or a fair-esm checkpoint (ESM-1b/1v/2 .pt file)",
    )
    if maskless:
        p.add_argument(
            "--maskless",
            default=None,
            metavar="DIR",
            help="instead of --model: predict each PLL in one forward pass with a student trained by "
            "`dscore train maskless` (its --output folder)",
        )
    p.add_argument("--output", required=True, help="output folder (local path or object-store URI)")
    if variant:
        add_options(p, ScoringOptions, ["variant"])
    add_compute_arguments(p)
    p.add_argument(
        "--shard-rows",
        type=int,
        default=None if fit_actors else shard_rows,
        help=f"rows per shard: the unit of work and resume (default {shard_rows}"
        + ("; fewer where rows are costly, so that a shard is about 30 s of scoring" if fit_actors and variant else "")
        + ("; on Ray fewer when that leaves a scoring actor without a shard)" if fit_actors else ")"),
    )
    p.set_defaults(default_shard_rows=shard_rows)
    p.add_argument("--overwrite", action="store_true", help="replace results of a different run in --output")
    add_storage_arguments(p)
    add_ray_group(p)


def add_storage_arguments(p: argparse.ArgumentParser) -> None:
    """How the run treats its object store (docs/runs.md), read by `storage_environment`."""
    p.add_argument(
        "--storage-retry-s",
        type=float,
        default=None,
        help="during the run, send a storage request that failed on an outage again for up to this many "
        "seconds before stopping as incomplete (default 120)",
    )
    p.add_argument(
        "--unsafe-lock",
        action="store_true",
        help="write to a store whose conditional requests dscore cannot use or did not prove (gs://, hdfs://, an S3 "
        "endpoint or proxy that ignores If-None-Match/If-Match, which the probe before the first lock finds) with a "
        "lock that two runs starting at the same instant could both take; you make sure no two runs share --output",
    )


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`env` set while the command runs, as it was again after (a command called from Python, a test)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def storage_environment(args: argparse.Namespace) -> dict[str, str]:
    """The storage flags as the environment that every process of the run reads (io.storage, io.lock): Ray's
    workers inherit it from the driver, or get it in their runtime environment on a cluster."""
    env = {}
    if getattr(args, "storage_retry_s", None) is not None:
        check_bounds("--storage-retry-s", args.storage_retry_s, 0)
        env[STORAGE_RETRY_ENV] = repr(args.storage_retry_s)
    if getattr(args, "unsafe_lock", False):
        env[UNSAFE_LOCK_ENV] = "1"
    return env


def add_compute_arguments(p: argparse.ArgumentParser) -> None:
    """How the model runs in one process: its token budget, device, dtype, revision and remote code
    (`model_spec` and `ScoringOptions.batch_tokens` read them)."""
    add_options(p, ScoringOptions, ["batch_tokens"])
    p.add_argument(
        "--device",
        type=parse_device,
        default="auto",
        help="auto (CUDA when torch sees a GPU), cpu, cuda, or cuda:N for one GPU of this machine",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="bfloat16/float16: weights in that dtype; auto (default): bfloat16 autocast over float32 weights on "
        "CUDA, float32 on CPU; the LM head's log-softmax runs in float32 (float64 with float64)",
    )
    add_revision(p)
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let transformers run Python code shipped with the model (off: such models are refused)",
    )


def add_ray_group(p: argparse.ArgumentParser) -> None:
    """The "Ray" group of a scoring command, read by `ray_options`: scoring on Ray actors instead of in
    this process."""
    ray = p.add_argument_group("Ray", "score on Ray actors instead of in this process")
    ray.add_argument("--ray", action="store_true", help="run the Ray Data pipeline (embedded local Ray by default)")
    add_address(ray)
    add_options(ray, RayOptions, ["num_actors", "cpus_per_actor", "stall_timeout_s"])
    add_verbose(ray, default=argparse.SUPPRESS)  # after the command too, without resetting `dscore --verbose`


def add_revision(p: Parser) -> None:
    p.add_argument("--revision", default=None, help="model revision (Hub models)")


def add_address(p: Parser) -> None:
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join: 'auto', host:port or ray://...; default $RAY_ADDRESS, else embedded",
    )


def add_verbose(p: Parser, default: object = False) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        default=default,
        help="also show Ray's own messages, its workers' output and Ray Data's progress bars on the "
        "terminal (they always go to the run log in Ray's session folder)",
    )


def add_long_texts(p: argparse.ArgumentParser) -> None:
    """--long-texts: what a PLL run does with a text longer than the model's window (`ScoringOptions.long_texts`)."""
    add_options(p, ScoringOptions, ["long_texts"])


def add_options(
    p: Parser, options: type, names: Iterable[str] | None = None, skip: Iterable[str] = (), unset: bool = False
) -> None:
    """The flags of an options class, declared once in its fields' metadata (`options.option`): those of
    `names` in that order, or else every flagged field in declaration order less `skip`. A boolean field
    that defaults to False is a switch; the others take a value of their default's type (a field without a
    default is a required flag). `unset`: the flags
    default to None (the field's default, to `options_from`), so that a command can tell a flag given from
    one left out."""
    declared = {f.name: (f, spec) for f, spec in flagged(options)}
    chosen = list(names) if names is not None else [n for n in declared if n not in set(skip)]
    for name in chosen:
        f, spec = declared[name]
        kwargs: dict = {"help": spec.help.format(default=f.default)}
        if f.default is False:
            kwargs["action"] = "store_true"
        else:
            required = f.default is dataclasses.MISSING
            kwargs |= {"required": True} if required else {"default": None if unset else f.default}
            kind = spec.type or (
                None if required or f.default is None or isinstance(f.default, str) else type(f.default)
            )
            kwargs |= {"type": kind} if kind else {}
            kwargs |= {"choices": spec.choices} if spec.choices else {}
            kwargs |= {"metavar": spec.metavar} if spec.metavar else {}
        p.add_argument(flag_name(f, spec), **kwargs)


def options_from(args: argparse.Namespace, options: type, **given: object) -> Any:
    """An options instance from the flags `add_options` declared (each through its `read`; one left unset
    takes its field's default), `given` supplying the fields the command reads otherwise."""
    values = {}
    for f, spec in flagged(options):
        dest = flag_name(f, spec).removeprefix("--").replace("-", "_")
        if f.name not in given and getattr(args, dest, None) is not None:
            value = getattr(args, dest)
            values[f.name] = spec.read(value) if spec.read else value
    return options(**values, **given)


def add_score_arguments(p: argparse.ArgumentParser, per_token_flag: bool = True, maskless: bool = False) -> None:
    """The flags of a PLL scoring run: `dscore score`, and `dscore audit`, which scores before it audits."""
    add_corpus_arguments(
        p, "text, JSONL, CSV/TSV or Parquet files, datasets folders, folders or globs of them", maskless=maskless
    )
    add_options(p, ScoringOptions, [*(("per_token", "conditionals") if per_token_flag else ()), "word_scores"])
    add_long_texts(p)
    add_options(p, ScoringOptions, ["split_chars"])
    p.add_argument(
        "--partition-column",
        default=None,
        help="column whose value partitions the rows (kept as `partition`; figures per partition)",
    )
    p.add_argument("--partition-by-file", action="store_true", help="partition the rows by input file")


def parse_device(value: str) -> str:
    """`--device`: one of DEVICES or cuda:N."""
    if value in DEVICES or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(DEVICES)} or cuda:N")


def model_spec(args: argparse.Namespace, name: str | None = None) -> ModelSpec:
    """The model of the model flags; `name` in place of --model (a --maskless student, a --causal-model). A
    fair-esm checkpoint stands for its converted folder (`offline.fair_esm`), converted here, before any work."""
    from ..offline.fair_esm import model_folder

    return ModelSpec(model_folder(name or args.model), args.revision, args.device, args.dtype, args.trust_remote_code)


def shard_rows(args: argparse.Namespace) -> int:
    """--shard-rows, or the command's default when it was not given."""
    return args.default_shard_rows if args.shard_rows is None else args.shard_rows


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run of a PLL scoring command (`add_score_arguments`)."""
    return RunConfig(
        inputs=InputSpec(
            tuple(args.inputs),
            args.text_column,
            args.id_column,
            shard_rows(args),
            args.partition_column,
            args.partition_by_file,
            allow_duplicate_ids=args.allow_duplicate_ids,
            fit_actors=args.shard_rows is None,
        ),
        model=model_spec(args, getattr(args, "maskless", None)),
        scoring=options_from(args, ScoringOptions),
        output=args.output,
    )


def prompt_config(args: argparse.Namespace) -> RunConfig:
    """The run of a command that fills or samples the masks of its rows (infill, sample): its inputs, ids,
    model, token budget and folder; no partitions and no PLL options."""
    return RunConfig(
        InputSpec(
            tuple(args.inputs),
            args.text_column,
            args.id_column,
            shard_rows(args),
            allow_duplicate_ids=args.allow_duplicate_ids,
            fit_actors=args.shard_rows is None,
        ),
        model_spec(args),
        ScoringOptions(batch_tokens=args.batch_tokens),
        args.output,
    )


def ray_options(args: argparse.Namespace) -> RayOptions | None:
    """Ray options when --ray or --address was given, else None (score in this process). They are built
    (and so checked) either way: an absurd --stall-timeout is refused, not ignored."""
    options = options_from(args, RayOptions, address=args.address, verbose=args.verbose)
    return options if args.ray or args.address else None


def student_folder(args: argparse.Namespace) -> str | None:
    """The --maskless student folder, or None; exactly one of --model and --maskless."""
    if (args.model is None) == (args.maskless is None):
        raise UserError("pass either --model (a masked LM's PLLs) or --maskless DIR (a student's predicted PLLs)")
    return args.maskless


def finish(args: argparse.Namespace, result: object, exit_code: int = 0) -> int:
    """The one way a command ends: its result alone on standard output (`args.result`; a text as it is,
    anything else as indented JSON, which scripts parse), and the exit code for `main` to return."""
    print(result if isinstance(result, str) else json.dumps(result, indent=2), file=args.result)
    return exit_code


class Command(NamedTuple):
    """A registry entry: the subcommand's name, its line in the parent's --help, its own --help text (None:
    usage and flags only), and the module that declares its flags (`add_arguments(parser)`) and runs it
    (`run(args) -> int`, the exit code). With `workload`, `{columns}` in the text is the columns of that
    workload's rows, from its declared schema (`workflows.columns`). A command module declares its own entry
    (`COMMAND`, its module left out: `discovered` fills it in), `place` ordering the parent's --help."""

    name: str
    help: str
    description: str | None = None
    workload: str | None = None
    place: int = 0
    module: ModuleType | None = None

    def text(self) -> str | None:
        if self.workload is None:
            return self.description
        from ..workflows.columns import columns

        return self.description.format(columns=columns(self.workload))


def discovered(package: ModuleType) -> tuple[Command, ...]:
    """The commands of `package`: every module (or subpackage) of it that declares `COMMAND`, with its module,
    by `place`. A new command is then its own module alone, with no list to edit."""
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):  # __main__ runs the CLI; it declares no command
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if hasattr(module, "COMMAND"):
            found.append(module.COMMAND._replace(module=module))
    return tuple(sorted(found, key=lambda command: command.place))


def add_commands(parser: argparse.ArgumentParser, commands: tuple[Command, ...], dest: str) -> None:
    """One subcommand of `parser` per entry, in the registry's order; its name lands in `args.<dest>`."""
    subparsers = parser.add_subparsers(dest=dest, required=True)
    for command in commands:
        command.module.add_arguments(subparsers.add_parser(command.name, help=command.help, description=command.text()))


def dispatch(commands: tuple[Command, ...], name: str, args: argparse.Namespace) -> int:
    """Run the entry called `name` (the `dest` of `add_commands`) on the parsed arguments."""
    return next(command for command in commands if command.name == name).module.run(args)
