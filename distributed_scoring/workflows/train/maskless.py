"""`dscore train maskless`: distil a PLL scoring run into a maskless student (Salazar et al., 2020, sec. 2.2
and 3.6; per position, Kim and Rush, 2016), then report how well and how fast it stands in for the PLL.

The teacher is a `dscore score` output folder: its ok rows (id, text, pll, and with `--per-token` each
scored token's term, with `--conditionals K` the top of each conditional) are split by a seeded hash of
the id, or of its parent's id with `parent_separator` (a chain and its point mutants fall on the same side),
tokenised on the driver (the student's tokenizer must give the teacher's scored tokens), and the student
(`engine.maskless`; its target says which) is trained on Ray Train. The report compares the student's
predictions with the teacher's PLLs on the held-out rows beside two baselines: a least-squares fit of the
PLL on the token count, and the masked LM read unmasked (`--method unmasked`, what a per-token student is
before training). It adds the per-token terms' agreement, the mutant-minus-parent differences, N-best
rescoring with teacher, student and `unmasked` (given N-best lists), and both scorers timed on the same
held-out sentences in one process: `maskless_eval` evaluates and writes report.md.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...config import ModelSpec, check_bounds
from ...engine.model_files import STUDENT_FILE, TARGET_DISTRIBUTION, TARGET_SENTENCE, TARGET_TOKEN, TARGETS
from ...errors import UserError
from ...io import schema as S
from ...io.claim import Claim, claim_training
from ...io.output import ROWS_DIR, RUN_FILE, SUMMARY_FILE, OutputDir
from ...io.storage import join
from ...workloads.maskless import RANGE
from ...workloads.prepare import PLLPreparer
from ..maskless import HELDOUT
from .maskless_eval import (
    RESCORE_DIR,
    evaluate_student,
    heldout_figures,
    parent_of,
    predictions_table,
    render_report,
    rescore_lists,
    summary_of,
)
from .run import (
    DATA_HELDOUT,
    DATA_TRAIN,
    REPORT_FILE,
    TARGET,
    TOKEN_TARGETS,
    TRAINING_OUTPUTS,
    TrainOptions,
    TrainResources,
    fit_on_ray,
    heldout_rows,
    on_ray,
    read_examples,
    run_task,
    start_worker,
    train,
    training_figures,
    training_fingerprint,
)

logger = logging.getLogger(__name__)

# default peak learning rate of the encoder (the paper used 1e-5 over 10 epochs of LibriSpeech text; the head
# learns faster, see engine.training)
LR = 1e-4
DEFAULT_TARGET = TARGET_DISTRIBUTION  # the target that won on the demo's held-out report (docs/train.md)
PREDICTIONS_FILE = "heldout_predictions.parquet"
REPORT_MD = "report.md"
SPEED_SENTENCES = 32  # default held-out sentences both scorers are timed on (the PLL engine's share dominates)
MIN_HELDOUT = 3  # rows a correlation needs
TEACHER_COLUMNS = (S.ID, S.TEXT, S.PLL, S.STATUS, S.N_TOKENS)
TEACHER_TOKENS = (S.TOKENS, S.TOKEN_LOGPROBS)
TEACHER_CONDITIONALS = (S.COND_IDS, S.COND_LOGPROBS, S.COND_REST)


@dataclass(frozen=True)
class StudentOptions:
    """What kind of student (all of it enters the run's fingerprint). `target`: `sentence` (the paper's
    regression of the PLL from the first token), `token` (each position's log q(w_t) regressed on the
    teacher's term) or `distribution` (each position's distribution fitted by KL to the teacher's
    conditional, plus `token_weight` times the token term). `parent_separator`: a row id `P<sep>...` is a
    variant of row `P`: both on the same side of the held-out split, compared in the report. `freeze_layers`:
    the embeddings and that many of the lowest transformer layers stay as they are."""

    target: str = DEFAULT_TARGET
    parent_separator: str | None = None
    freeze_layers: int = 0
    token_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UserError(f"--target {self.target!r} is not one of {', '.join(TARGETS)}")
        if self.parent_separator == "":
            raise UserError("--parent-separator must be a non-empty string")
        if self.freeze_layers < 0 or not self.token_weight >= 0:
            raise UserError(
                f"--freeze-layers and --token-weight must be >= 0, got {self.freeze_layers} and {self.token_weight}"
            )

    @property
    def weights(self) -> tuple[float, float]:
        """(token term, KL term) of a per-token student's loss."""
        return (1.0, 0.0) if self.target == TARGET_TOKEN else (self.token_weight, 1.0)


@dataclass(frozen=True)
class NBest:
    """N-best lists to rescore with the teacher, the student and `unmasked` after training (WER or BLEU
    by `metric`), e.g. built from held-out rows; None for no rescoring."""

    dev: str
    test: str
    metric: str = "wer"


@dataclass(frozen=True)
class Teacher:
    """A PLL scoring run's usable rows (ok, finite PLL: id, text, pll, n_tokens, and the per-token columns
    it has) and what it says of itself."""

    folder: str
    rows: pa.Table
    total: int
    split_chars: bool
    variant: str
    model: str | None

    @property
    def digest(self) -> str:
        """Identity of the targets: a different teacher in the same folder is a different run."""
        pairs = sorted(zip(self.rows[S.ID].to_pylist(), self.rows[S.PLL].to_pylist()))
        return hashlib.sha256("\n".join(f"{i}\t{p!r}" for i, p in pairs).encode()).hexdigest()

    def has(self, columns: tuple[str, ...]) -> bool:
        return all(c in self.rows.column_names for c in columns)


def read_teacher(folder: str) -> Teacher:
    """The teacher's rows, refused with what to do when the folder is no finished PLL run with usable rows."""
    out = OutputDir(folder)
    if not out.exists(out.root):
        raise UserError(f"teacher folder {folder!r} does not exist: pass the --output folder of a `dscore score` run")
    files = out.row_parts()
    if not files:
        raise UserError(
            f"teacher folder {folder!r} holds no scored rows ({ROWS_DIR}/*.parquet): pass the --output "
            "folder of a finished `dscore score` run"
        )
    try:
        run = out.read_json(RUN_FILE) or {}
    except ValueError as exc:
        raise UserError(f"{folder}/{RUN_FILE} is damaged ({exc}); score the teacher again") from exc
    if run.get("workload", "pll") != "pll":
        raise UserError(
            f"teacher folder {folder!r} holds a {run['workload']!r} run; the teacher must be a PLL run (`dscore score`)"
        )
    columns = pq.read_schema(files[0], filesystem=out.fs).names
    missing = [c for c in TEACHER_COLUMNS if c not in columns]
    if missing:
        raise UserError(
            f"the teacher's rows ({files[0]}) have no {', '.join(missing)} column(s) (they have "
            f"{', '.join(columns)}): pass the folder of a PLL run (`dscore score`)"
        )
    wanted = [*TEACHER_COLUMNS, *(c for c in (*TEACHER_TOKENS, *TEACHER_CONDITIONALS) if c in columns)]
    table = pq.read_table(files, filesystem=out.fs, columns=wanted)
    usable = pc.and_(pc.equal(table[S.STATUS], S.STATUS_OK), pc.is_finite(table[S.PLL]))
    rows = table.filter(pc.fill_null(usable, False))
    if rows.num_rows == 0:
        raise UserError(
            f"all {table.num_rows} rows of teacher folder {folder!r} are error rows (or have no PLL): "
            "nothing to learn from; check its `error` column"
        )
    if not out.exists(out.path(SUMMARY_FILE)):
        logger.warning(
            "teacher folder %s has no %s: its run may be unfinished (only the rows written are used)",
            folder,
            SUMMARY_FILE,
        )
    return Teacher(
        folder,
        rows.drop_columns([S.STATUS]),
        table.num_rows,
        bool(run.get("split_chars")),
        run.get("variant", "original"),
        run.get("model"),
    )


def check_teacher_has(teacher: Teacher, student: StudentOptions) -> None:
    """A per-token target needs the teacher's per-token terms, `distribution` its conditionals too."""
    if student.target != TARGET_SENTENCE and not teacher.has(TEACHER_TOKENS):
        raise UserError(
            f"--target {student.target} needs the teacher's per-token scores, and teacher folder "
            f"{teacher.folder!r} has none: score it with `dscore score --per-token`"
        )
    if student.target == TARGET_DISTRIBUTION and not teacher.has(TEACHER_CONDITIONALS):
        raise UserError(
            f"--target distribution needs the teacher's conditionals, and teacher folder {teacher.folder!r} "
            "has none: score it with `dscore score --per-token --conditionals K` (K >= the vocabulary "
            "for all of it; see docs/train.md)"
        )


@dataclass(frozen=True)
class MasklessJob:
    """What the training workers and the evaluation task need (torch-free, pickled to them)."""

    model: ModelSpec
    location: str
    options: TrainOptions
    student: StudentOptions
    steps: int
    checkpoint_every: int
    mean: float
    std: float
    meta: dict
    variant: str
    batch_tokens: int | None


def train_maskless(
    teacher_folder: str,
    model: ModelSpec,
    output: str,
    options: TrainOptions = TrainOptions(lr=LR),
    resources: TrainResources = TrainResources(),
    overwrite: bool = False,
    batch_tokens: int | None = None,
    student: StudentOptions = StudentOptions(),
    nbest: NBest | None = None,
    speed_sentences: int = SPEED_SENTENCES,
) -> dict:
    """Train a student on the teacher into `output`, evaluate it on the held-out rows; returns the report
    (also DIR/report.json and DIR/report.md). The student and the PLL engine are timed on the first
    `speed_sentences` held-out rows (at least 2). Every check that needs no model weights runs before the
    folder is touched."""
    check_bounds("--batch-tokens", batch_tokens, 1)
    teacher, train_table, heldout_table, left_out = _read_and_split(
        teacher_folder, model, options, resources, student, nbest, speed_sentences
    )
    targets = np.asarray(train_table[TARGET].to_pylist())
    per_token = targets / np.asarray([len(t) for t in train_table[S.TARGETS].to_pylist()])
    run = training_fingerprint(
        "maskless",
        model,
        options,
        {
            "teacher": teacher_folder,
            "teacher_rows": teacher.digest,
            **asdict(student),
            "nbest": asdict(nbest) if nbest else None,
        },
    )
    inputs = [teacher_folder, *([p for p in (nbest.dev, nbest.test) if p] if nbest else [])]
    with claim_training(output, run, overwrite, inputs, [model.name], TRAINING_OUTPUTS) as folder:
        out = folder.out
        out.write_table(DATA_TRAIN, train_table)
        heldout_path = out.write_table(DATA_HELDOUT, heldout_table)
        steps = options.total_steps(train_table.num_rows)
        meta = {
            "target": student.target,
            "teacher": teacher_folder,
            "teacher_model": teacher.model,
            "teacher_variant": teacher.variant,
            "teacher_rows": teacher.digest,
            "base_model": model.name,
            "split_chars": teacher.split_chars,
            RANGE: {"pll_per_token": [float(per_token.min()), float(per_token.max())]},
        }
        job = MasklessJob(
            model,
            out.location,
            options,
            student,
            steps,
            resources.checkpoint_every,
            float(targets.mean()),
            float(targets.std()) or 1.0,
            meta,
            teacher.variant,
            batch_tokens,
        )
        evaluation, rescored = _train_and_evaluate(folder, job, resources, heldout_path, nbest, speed_sentences)
        predictions = predictions_table(heldout_table, evaluation)
        folder.write_table(PREDICTIONS_FILE, predictions)
        heldout = heldout_figures(heldout_table, train_table, predictions, student.parent_separator)
        folder.write_json(STUDENT_FILE, {**out.read_json(STUDENT_FILE), HELDOUT: summary_of(heldout)})
        report = {
            "command": "train maskless",
            "target": student.target,
            "teacher": teacher_folder,
            "teacher_model": teacher.model,
            "model": model.name,
            "output": output,
            "rows": {
                "teacher": teacher.total,
                "usable": teacher.rows.num_rows,
                "train": train_table.num_rows,
                "heldout": heldout_table.num_rows,
                "left_out_over_max_length": left_out,
            },
            "training": {
                **training_figures(out, steps, options, LOSSES[student.target]),
                "target_mean": job.mean,
                "target_std": job.std,
                **asdict(student),
                "training_range": meta[RANGE],
            },
            "heldout": heldout,
            "rescoring": rescored,
            "speed": evaluation["speed"],
        }
        folder.write_json(REPORT_FILE, report)
        folder.write_text(REPORT_MD, render_report(report))
    return report


def _read_and_split(
    teacher_folder: str,
    model: ModelSpec,
    options: TrainOptions,
    resources: TrainResources,
    student: StudentOptions,
    nbest: NBest | None,
    speed_sentences: int,
) -> tuple[Teacher, pa.Table, pa.Table, int]:
    """(teacher, training table, held-out table, training rows left out as too long): the teacher read and
    split by `_split`, after every check of the inputs that needs no model weights, before the folder is touched."""
    from ...engine.model_files import load_tokenizer

    teacher = read_teacher(teacher_folder)
    check_teacher_has(teacher, student)
    tokenizer, model_max = load_tokenizer(model)
    train_table, heldout_table, left_out = _split(
        teacher, PLLPreparer(tokenizer, model_max, teacher.split_chars), options, student
    )
    if heldout_table.num_rows < MIN_HELDOUT:
        raise UserError(
            f"the held-out split has {heldout_table.num_rows} of {teacher.rows.num_rows} usable teacher rows; "
            f"a correlation needs at least {MIN_HELDOUT}: raise --heldout or score more rows"
        )
    if train_table.num_rows < max(options.batch_size, resources.num_workers):
        raise UserError(
            f"{train_table.num_rows} training rows ({left_out} over --max-length {options.max_length} left "
            f"out) do not fill one batch of --batch-size {options.batch_size} over {resources.num_workers} "
            "workers: lower --batch-size, raise --max-length or score more rows"
        )
    if nbest is not None:
        _check_nbest(nbest)
    if speed_sentences < 2:
        raise UserError(
            f"--speed-sentences must be at least 2 (one untimed warm-up call takes two), got {speed_sentences}"
        )
    return teacher, train_table, heldout_table, left_out


def _train_and_evaluate(
    folder: Claim,
    job: MasklessJob,
    resources: TrainResources,
    heldout_path: str,
    nbest: NBest | None,
    speed_sentences: int,
) -> tuple[dict, dict | None]:
    """(evaluation, rescoring figures or None): the student trained on Ray Train into the held folder, then
    evaluated on the held-out rows and, given N-best lists, used to rescore them, each in a Ray task."""
    with on_ray(resources):
        fit_on_ray(maskless_worker, job, resources, folder.out)
        folder.record_new()  # the student worker 0 saved
        evaluation = run_task(
            evaluate_student, resources, job, heldout_path, resources.cpus_per_worker, speed_sentences
        )
        if nbest:
            folder.record(RESCORE_DIR)  # before the task's rescoring runs write there
        rescored = run_task(rescore_lists, resources, job, nbest, resources.cpus_per_worker) if nbest else None
    return evaluation, rescored


LOSSES = {
    TARGET_SENTENCE: "mean squared error of the predicted PLL over the teacher's std",
    TARGET_TOKEN: "mean squared error of log q_t(w_t) against the teacher's log p(w_t | W without w_t), per token",
    TARGET_DISTRIBUTION: "KL(p_teacher(.|W without w_t) || q_t) per token, plus token_weight times the token term",
}


def _split(
    teacher: Teacher, preparer: PLLPreparer, options: TrainOptions, student: StudentOptions
) -> tuple[pa.Table, pa.Table, int]:
    """(training table, held-out table, training rows left out as longer than --max-length), tokenised, the
    split by (parent) id. Held-out rows are kept whatever their length (the student reads up to the model's
    maximum). The tokenizer must give each row the tokens the teacher scored."""
    prepared = preparer.prepare_texts(teacher.rows[S.TEXT].to_pylist())
    _check_tokens(teacher, preparer, prepared)
    ids = teacher.rows[S.ID].to_pylist()
    held = heldout_rows([parent_of(i, student.parent_separator) for i in ids], options.seed, options.heldout)
    fits = np.array([p.error is None for p in prepared])
    short = np.array([p.error is None and len(p.input_ids) <= options.max_length for p in prepared])
    table = teacher.rows
    for name, values in {
        S.INPUT_IDS: pa.array([p.input_ids for p in prepared], pa.list_(pa.int32())),
        S.TARGETS: pa.array([p.targets for p in prepared], pa.list_(pa.int32())),
        S.PIECE_WORDS: pa.array([p.piece_words for p in prepared], pa.list_(pa.int32())),
    }.items():
        table = table.append_column(name, values)
    train = table.filter(pa.array(~held & short))
    train_columns = {S.ID: S.ID, S.INPUT_IDS: S.INPUT_IDS, S.TARGETS: S.TARGETS, S.PLL: TARGET}
    if student.target != TARGET_SENTENCE:
        train_columns[S.TOKEN_LOGPROBS] = TOKEN_TARGETS
    if student.target == TARGET_DISTRIBUTION:
        train_columns.update({c: c for c in TEACHER_CONDITIONALS})
    train = train.select(list(train_columns)).rename_columns(list(train_columns.values()))
    heldout_columns = [
        S.ID,
        S.TEXT,
        S.PLL,
        S.INPUT_IDS,
        S.TARGETS,
        S.PIECE_WORDS,
        *([S.TOKEN_LOGPROBS] if teacher.has(TEACHER_TOKENS) else []),
    ]
    return train, table.filter(pa.array(held & fits)).select(heldout_columns), int((~held & fits & ~short).sum())


def _check_tokens(teacher: Teacher, preparer: PLLPreparer, prepared: list) -> None:
    """The student's scored tokens are the teacher's: as many per row (and the same tokens, where the
    teacher wrote them); else the --model's tokenizer is not the teacher's, and its targets would not line up."""
    counts = teacher.rows[S.N_TOKENS].to_pylist()
    tokens = teacher.rows[S.TOKENS].to_pylist() if teacher.has(TEACHER_TOKENS) else [None] * len(counts)
    for row_id, p, count, scored in zip(teacher.rows[S.ID].to_pylist(), prepared, counts, tokens):
        if p.error is not None:
            continue
        mine = preparer.tokenizer.convert_ids_to_tokens([p.input_ids[t] for t in p.targets])
        if len(mine) != count or (scored is not None and mine != scored):
            raise UserError(
                f"row {row_id!r}: the teacher scored {count} tokens ({' '.join((scored or [])[:8])} ...), "
                f"--model's tokenizer gives {len(mine)} ({' '.join(mine[:8])} ...): a student must use its "
                "teacher's tokenizer; pass the teacher's model (or one fine-tuned from it) as --model"
            )


def _check_nbest(nbest: NBest) -> None:
    for name, path in (("--nbest-dev", nbest.dev), ("--nbest-test", nbest.test)):
        if not OutputDir(path).exists(path):
            raise UserError(
                f"{name} {path!r} does not exist: pass an N-best list (JSONL, Parquet or ESPnet JSON, "
                "as `dscore rescore` reads it)"
            )


def maskless_worker(config: dict) -> None:
    """One Ray Train worker: the student trained on the training split; worker 0 writes it into DIR."""
    from ...engine.masked_lm import load_masked_lm
    from ...engine.maskless import regressor_for, save_student
    from ...engine.training import SentenceObjective, TokenObjective, freeze_lower

    job: MasklessJob = config["job"]
    worker = start_worker(config)
    mlm = load_masked_lm(replace(job.model, device=worker.device))
    freeze_lower(mlm.model, job.student.freeze_layers)
    regressor = (
        regressor_for(mlm, job.mean, job.std, job.options.seed) if job.student.target == TARGET_SENTENCE else None
    )
    objective = (
        SentenceObjective(regressor, mlm) if regressor is not None else TokenObjective(mlm, *job.student.weights)
    )
    train(objective, read_examples(join(job.location, DATA_TRAIN)), job, worker, "maskless")
    if worker.rank == 0:
        save_student(mlm, job.location, job.meta, regressor)
