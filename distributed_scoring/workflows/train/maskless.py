"""`dscore train maskless`: distil a PLL scoring run into a maskless student (Salazar et al., 2020, sec. 2.2
and 3.6; per position, Kim and Rush, 2016), then report how well and how fast it stands in for the PLL.

The teacher is a `dscore score` output folder: its ok rows (id, text, pll, and with `--per-token` each
scored token's term, with `--conditionals K` the top of each conditional) are split by a seeded hash of
the id, or of its parent's id with `parent_separator` (a chain and its point mutants fall on the same side),
tokenised on the driver (the student's tokenizer must give the teacher's scored tokens), and the student
(`engine.maskless`; its target says which) is trained on Ray Train, then calibrated on the held-out rows
(an affine map per token of its predictions to the teacher's PLLs, stored in maskless.json and applied
whenever it scores). The report compares the student's predictions, raw and calibrated (cross-fitted), with
the teacher's PLLs on the held-out rows beside two baselines: a least-squares fit of the PLL on the token
count, and the masked LM read unmasked (`--method unmasked`, what a per-token student is before training).
It adds the per-token terms' agreement, the mutant-minus-parent differences, the corpus PPPLs and their
gaps to the teacher's, N-best rescoring with teacher, (calibrated) student and `unmasked` (given N-best
lists), and both scorers timed on the same held-out sentences in one process: `maskless_eval` evaluates
and writes report.md.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace

import numpy as np
import pyarrow as pa

from ...config import ModelSpec
from ...engine.model_files import (
    CALIBRATION,
    STUDENT_FILE,
    TARGET_DISTRIBUTION,
    TARGET_SENTENCE,
    TARGET_TOKEN,
)
from ...errors import UserError
from ...io import schema as S
from ...io.claim import Claim, claim_training
from ...io.output import REPORT_JSON, REPORT_MD, OutputDir
from ...io.storage import join
from ...options import check_bounds
from ...workloads.maskless import RANGE
from ...workloads.prepare import PLLPreparer
from ..maskless import HELDOUT
from .maskless_eval import (
    RESCORE_DIR,
    calibration_record,
    cross_fitted,
    evaluate_student,
    fit_calibration,
    heldout_figures,
    parent_of,
    predictions_table,
    render_report,
    rescore_lists,
    summary_of,
    token_counts,
)
from .maskless_job import MasklessJob, NBest, StudentOptions
from .run import (
    DATA_HELDOUT,
    DATA_TRAIN,
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
from .teacher import TEACHER_CONDITIONALS, TEACHER_TOKENS, Teacher, check_teacher_has, read_teacher

logger = logging.getLogger(__name__)

# default peak learning rate of the encoder (the paper used 1e-5 over 10 epochs of LibriSpeech text; the head
# learns faster, see engine.training)
LR = 1e-4
PREDICTIONS_FILE = "heldout_predictions.parquet"
SPEED_SENTENCES = 32  # default held-out sentences both scorers are timed on (the PLL engine's share dominates)
MIN_HELDOUT = 3  # rows a correlation needs


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
    run = _fingerprint(teacher, model, options, student, nbest)
    inputs = [teacher_folder, *([p for p in (nbest.dev, nbest.test) if p] if nbest else [])]
    with claim_training(output, run, overwrite, inputs, [model.name], TRAINING_OUTPUTS) as folder:
        out = folder.out
        out.write_table(DATA_TRAIN, train_table)
        heldout_path = out.write_table(DATA_HELDOUT, heldout_table)
        job = _student_job(teacher, train_table, model, out.location, options, student, resources, batch_tokens)
        evaluation, calibration, rescored = _train_and_evaluate(
            folder, job, resources, heldout_table, heldout_path, nbest, speed_sentences
        )
        calibrated = cross_fitted(heldout_table, evaluation["student"], student.parent_separator, options.seed)
        predictions = predictions_table(heldout_table, evaluation, calibrated)
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
            "rows": _rows_report(teacher, train_table, heldout_table, left_out),
            "training": _training_report(out, job),
            "heldout": heldout,
            CALIBRATION: calibration,
            "rescoring": rescored,
            "speed": evaluation["speed"],
        }
        folder.write_json(REPORT_JSON, report)
        folder.write_text(REPORT_MD, render_report(report))
    return report


def _fingerprint(
    teacher: Teacher, model: ModelSpec, options: TrainOptions, student: StudentOptions, nbest: NBest | None
) -> dict:
    """What the training folder's run depends on: beside the model and the schedule, the teacher (its
    folder and its rows), the student's options and the N-best lists."""
    return training_fingerprint(
        "maskless",
        model,
        options,
        {
            "teacher": teacher.folder,
            "teacher_rows": teacher.digest,
            **asdict(student),
            "nbest": asdict(nbest) if nbest else None,
        },
    )


def _student_job(
    teacher: Teacher,
    train_table: pa.Table,
    model: ModelSpec,
    location: str,
    options: TrainOptions,
    student: StudentOptions,
    resources: TrainResources,
    batch_tokens: int | None,
) -> MasklessJob:
    """The job of a student trained into `location`: its steps, the training PLLs' mean and std (the
    sentence head's scale) and the meta its folder records (target, teacher, base model, the range of
    per-token PLLs it was trained on)."""
    targets = np.asarray(train_table[TARGET].to_pylist())
    per_token = targets / token_counts(train_table)
    meta = {
        "target": student.target,
        "teacher": teacher.folder,
        "teacher_model": teacher.model,
        "teacher_variant": teacher.variant,
        "teacher_rows": teacher.digest,
        "base_model": model.name,
        "split_chars": teacher.split_chars,
        RANGE: {"pll_per_token": [float(per_token.min()), float(per_token.max())]},
    }
    return MasklessJob(
        model,
        location,
        options,
        student,
        options.total_steps(train_table.num_rows),
        resources.checkpoint_every,
        float(targets.mean()),
        float(targets.std()) or 1.0,
        meta,
        teacher.variant,
        batch_tokens,
    )


def _rows_report(teacher: Teacher, train_table: pa.Table, heldout_table: pa.Table, left_out: int) -> dict:
    """The report's row counts: the teacher's, its usable ones, each split's and those left out as too long."""
    return {
        "teacher": teacher.total,
        "usable": teacher.rows.num_rows,
        "train": train_table.num_rows,
        "heldout": heldout_table.num_rows,
        "left_out_over_max_length": left_out,
    }


def _training_report(out: OutputDir, job: MasklessJob) -> dict:
    """The report's training section: the losses logged, the targets' scale, the student's options and the
    range it was trained on."""
    return {
        **training_figures(out, job.steps, job.options, LOSSES[job.student.target]),
        "target_mean": job.mean,
        "target_std": job.std,
        **asdict(job.student),
        "training_range": job.meta[RANGE],
    }


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
    heldout: pa.Table,
    heldout_path: str,
    nbest: NBest | None,
    speed_sentences: int,
) -> tuple[dict, dict | None, dict | None]:
    """(evaluation, calibration record or None, rescoring figures or None): the student trained on Ray Train
    into the held folder, evaluated on the held-out rows, calibrated on them (the map written into its
    maskless.json before anything scores with it) and, given N-best lists, used to rescore them, each in a
    Ray task."""
    with on_ray(resources):
        fit_on_ray(maskless_worker, job, resources, folder.out)
        folder.record_new()  # the student worker 0 saved
        logger.info(
            "evaluating the student on %d held-out rows in a Ray task: it loads the student and the masked LM, "
            "and times both on %d of them",
            heldout.num_rows,
            min(speed_sentences, heldout.num_rows),
        )
        evaluation = run_task(
            evaluate_student, resources, job, heldout_path, resources.cpus_per_worker, speed_sentences
        )
        calibration = _calibrate(folder, heldout, evaluation["student"]["pll"])
        if nbest:
            folder.record(RESCORE_DIR)  # before the task's rescoring runs write there
        rescored = run_task(rescore_lists, resources, job, nbest, resources.cpus_per_worker) if nbest else None
    return evaluation, calibration, rescored


def _calibrate(folder: Claim, heldout: pa.Table, predicted: list[float]) -> dict | None:
    """The student's calibration fitted on every held-out row and written into its maskless.json (replacing
    a previous run's); its record, or None when none could be fitted (the student then scores uncalibrated)."""
    calibration = fit_calibration(np.asarray(heldout[S.PLL].to_pylist()), np.asarray(predicted), token_counts(heldout))
    record = None if calibration is None else calibration_record(calibration, heldout)
    info = {k: v for k, v in folder.out.read_json(STUDENT_FILE).items() if k != CALIBRATION}
    folder.write_json(STUDENT_FILE, {**info, **({CALIBRATION: record} if record else {})})
    return record


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
