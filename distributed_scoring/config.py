"""Frozen, validated configuration for a scoring run.

Every knob a run depends on lives here, so the same objects describe an in-process run and a Ray run,
and a run's fingerprint (see `output.py`) can be computed from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import UserError
from .options import check, check_bounds, option

VARIANTS = ("original", "word_l2r")
LONG_TEXTS = ("window", "error")  # --long-texts: a text over the model's window scored in windows, or an error row
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")
# What the storage flags set for every process of a run, through the environment that the run's processes
# inherit (cli.common.add_storage_arguments): `--storage-retry-s`, read by io.storage.retry_budget, and
# `--unsafe-lock`, read by io.lock.
STORAGE_RETRY_ENV = "DSCORE_STORAGE_RETRY_S"
UNSAFE_LOCK_ENV = "DSCORE_UNSAFE_LOCK"


@dataclass(frozen=True)
class ModelSpec:
    """Which masked LM to load and where to run it.

    `name` is a local folder or a Hub id. `dtype`: `auto` means bfloat16 autocast over float32 weights on
    CUDA and float32 on CPU; `bfloat16` and `float16` load the weights in that dtype (no autocast: half the
    memory traffic); the log-softmax over the LM head's logits runs in float32 either way, in float64 with
    `float64`, where the whole model does (for reference-grade precision, at twice the CPU cost).
    `trust_remote_code` lets transformers run Python files that come with the model folder or Hub repo;
    off unless asked for, since that code runs with the user's rights on every node.
    """

    name: str
    revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise UserError("model name is empty: pass a local folder or a Hub id with --model")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise UserError(f"device {self.device!r} is not one of {DEVICES} or cuda:N")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype {self.dtype!r} is not one of {DTYPES}")


@dataclass(frozen=True)
class ScoringOptions:
    """How PLLs are computed and what is written per sentence.

    `batch_tokens` bounds rows x padded length of one forward pass; None picks a default for the device.
    `split_chars` puts a space between the characters of each text before tokenising (per-residue models,
    see `prepare.split_characters`); it changes the scores, so it enters the run's fingerprint.
    `conditionals` > 0 also writes the top that many tokens of each scored token's conditional (all of
    it when at least the vocabulary's size): what `dscore train maskless --target distribution` fits.
    `long_texts`: a text longer than the model's window is scored in windows (`window`, `engine.windows`)
    or is an error row (`error`).
    """

    variant: str = option(
        "original", "original (Salazar et al. 2020) or word_l2r (Kauf & Ivanova 2023)", choices=VARIANTS
    )
    batch_tokens: int | None = option(
        None, "token budget of one forward pass, rows x padded length (default: 1024 CPU, 65536 CUDA)", low=1, type=int
    )
    per_token: bool = option(
        False,
        "also write scored tokens and their log-probs (with --maskless, a token or distribution student's "
        "prediction of each)",
    )
    word_scores: bool = option(False, "also write per-word scores (sums over pieces)")
    split_chars: bool = option(
        False,
        "put a space between characters before tokenising: for per-residue models (protein, antibody) given "
        "sequences without spaces; n_unknown in the output counts unreadable tokens",
    )
    conditionals: int = option(
        0,
        "with --per-token: also write the K most probable tokens of each scored token's conditional and the mass "
        "of the rest (K >= the vocabulary: all of it), the targets of `dscore train maskless --target "
        "distribution` (default 0: off)",
        low=0,
        metavar="K",
    )
    long_texts: str = option(
        "window",
        "a text longer than the model's maximum length: score each token in a window of the model's width "
        "centred on it (window, the default; such rows say `windowed`) or leave an error row (error)",
        choices=LONG_TEXTS,
    )

    def __post_init__(self) -> None:
        check(self)
        if self.conditionals and not self.per_token:
            raise UserError(
                "--conditionals writes a conditional per scored token, beside the per-token columns: add --per-token"
            )


@dataclass(frozen=True)
class RowCost:
    """A row's estimated scoring work, as a workload declares it (`pipeline.workload.Workload.row_cost`):
    scoring a row of n tokens runs passes_per_token * n + passes_per_row forward passes of n + 2 positions
    (the specials), at flops_per_position FLOPs each."""

    flops_per_position: float
    passes_per_token: float = 1.0
    passes_per_row: float = 0.0

    def flops(self, n_tokens: float) -> float:
        return (self.passes_per_token * n_tokens + self.passes_per_row) * (n_tokens + 2) * self.flops_per_position


@dataclass(frozen=True)
class ShardCost:
    """Shards cut by work rather than rows when --shard-rows is not given (`InputSpec.cost`,
    `pipeline.sizing`): a record of b bytes is taken as b / bytes_per_token tokens (at least 1; the ratio the
    workload's own tokenizer gives on the input's first rows), and a shard ends before the record whose
    `row` cost would take it past `flops_per_shard` (it always holds one record). Recorded in `_run.json`,
    so that a rerun on another machine cuts the same shards and resumes them."""

    row: RowCost
    bytes_per_token: float
    flops_per_shard: float

    def record_flops(self, n_bytes: int) -> float:
        return self.row.flops(max(1.0, n_bytes / self.bytes_per_token))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ShardCost":
        return cls(RowCost(**d["row"]), float(d["bytes_per_token"]), float(d["flops_per_shard"]))


@dataclass(frozen=True)
class InputSpec:
    """The corpus: files (or folders, globs, URIs), which column holds the text, which the id.

    `shard_rows` is the unit of work and of resume: each shard is read, scored and written as a whole.
    With `cost`, shards are cut by estimated work too, `shard_rows` their most rows (`ShardCost`).
    With `fit_actors` it is a default that a Ray run lowers until every scoring actor it starts has a shard
    (`pipeline.runner.claimed`): a corpus of 260 rows is not one shard for one actor of three.
    Rows get a `partition` column from `partition_column`, or the input file's name with
    `partition_by_file` (for per-partition figures, e.g. the audit). `extra_columns` are carried into
    the read rows as strings where a record has them, null elsewhere (infilling's answers, say).
    Ids of an `id_column` must be unique (`io.ids`) unless `allow_duplicate_ids`: rows then carry a
    `line` column, where each was read, and are keyed by id and line.
    """

    paths: tuple[str, ...]
    text_column: str = "text"
    id_column: str | None = None
    shard_rows: int = 1000
    partition_column: str | None = None
    partition_by_file: bool = False
    extra_columns: tuple[str, ...] = ()
    allow_duplicate_ids: bool = False
    fit_actors: bool = False
    cost: ShardCost | None = None

    @property
    def partitioned(self) -> bool:
        return self.partition_column is not None or self.partition_by_file

    def __post_init__(self) -> None:
        if not self.paths:
            raise UserError("no input given: pass at least one file, folder, glob or URI")
        if self.partition_column is not None and self.partition_by_file:
            raise UserError("partition either by a column or by input file, not both")
        check_bounds("--shard-rows", self.shard_rows, 1)


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run goes.

    `address` None joins `RAY_ADDRESS` when it is set (as inside `ray job submit`), else starts an
    embedded local Ray. `num_actors` and `cpus_per_actor` default from the cluster's resources (see
    `pipeline.resources.plan_resources`). A run with no shard finished for `stall_timeout_s` fails
    instead of hanging. Ray's own messages (its log, its workers' output, Ray Data's progress bars) go
    to the run's log file in Ray's session folder, and to the terminal too only when `verbose`.
    """

    address: str | None = None
    num_actors: int | None = option(
        None, "scoring actors, one model replica each (default: one per GPU, else as CPUs allow)", low=1, type=int
    )
    cpus_per_actor: float | None = option(
        None, "CPUs of each CPU scoring actor (default 4 or fewer)", low=0, above=True, type=float
    )
    stall_timeout_s: float = option(
        1800.0,
        "fail when no shard finishes for this many seconds (default {default:g})",
        low=0,
        above=True,
        name="--stall-timeout",
    )
    verbose: bool = False

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class RunConfig:
    """One scoring run: inputs, model, options and the output folder."""

    inputs: InputSpec
    model: ModelSpec
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    output: str = "out"

    def to_dict(self) -> dict:
        return asdict(self)
