"""`dscore train maskless`: distil a PLL scoring run into a maskless student (Salazar et al., 2020, sec. 2.2
and 3.6), then report how well and how fast it stands in for the PLL.

The teacher is a `dscore score` output folder: its ok rows (id, text, pll) are split by a seeded hash of
the id, tokenised on the driver, and the student (the MLM's encoder plus a linear head over the first
token, `engine.maskless`) is trained on Ray Train to regress the PLL. The report compares the student's
predictions with the teacher's PLLs on the held-out rows (Pearson and Spearman, of the PLL and of the
PLL per token, since a sentence's PLL is mostly its length: a least-squares fit of the PLL on the token
count is reported beside them as the baseline a student must beat) and times both scorers on the same
held-out sentences in one process (sentences/s and the speed-up).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...config import ModelSpec, check_bounds
from ...errors import UserError
from ...io import schema as S
from ...io.output import ROWS_DIR, RUN_FILE, SUMMARY_FILE, OutputDir
from ...io.storage import join
from ...workloads.prepare import Preparer
from .run import (
    DATA_HELDOUT, DATA_TRAIN, REPORT_FILE, TARGET, TrainOptions, TrainResources, claimed, fingerprint, fit_on_ray,
    heldout_rows, on_ray, read_examples, run_task, set_threads, start_worker, train, training_figures,
)

logger = logging.getLogger(__name__)

LR = 1e-4  # default peak learning rate of the encoder (the paper used 1e-5 over 10 epochs of LibriSpeech text; the head learns faster, see engine.training)
PREDICTIONS_FILE = "heldout_predictions.parquet"
PREDICTED = "predicted"
SPEED_SENTENCES = 32  # held-out sentences both scorers are timed on (the PLL engine's share dominates)
MIN_HELDOUT = 3  # rows a correlation needs


@dataclass(frozen=True)
class Teacher:
    """A PLL scoring run's usable rows (ok, finite PLL: id, text, pll) and what it says of itself."""

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


def read_teacher(folder: str) -> Teacher:
    """The teacher's rows, refused with what to do when the folder is no finished PLL run with usable rows."""
    out = OutputDir(folder)
    if not out.exists(out.root):
        raise UserError(f"teacher folder {folder!r} does not exist: pass the --output folder of a `dscore score` run")
    files = out.row_parts()
    if not files:
        raise UserError(f"teacher folder {folder!r} holds no scored rows ({ROWS_DIR}/*.parquet): pass the --output "
                        "folder of a finished `dscore score` run")
    try:
        run = out.read_json(RUN_FILE) or {}
    except ValueError as exc:
        raise UserError(f"{folder}/{RUN_FILE} is damaged ({exc}); score the teacher again") from exc
    if run.get("workload", "pll") != "pll":
        raise UserError(f"teacher folder {folder!r} holds a {run['workload']!r} run; the teacher must be a PLL run "
                        "(`dscore score`)")
    columns = pq.read_schema(files[0], filesystem=out.fs).names
    missing = [c for c in (S.ID, S.TEXT, S.PLL, S.STATUS) if c not in columns]
    if missing:
        raise UserError(f"the teacher's rows ({files[0]}) have no {', '.join(missing)} column(s) (they have "
                        f"{', '.join(columns)}): pass the folder of a PLL run (`dscore score`)")
    table = pq.read_table(files, filesystem=out.fs, columns=[S.ID, S.TEXT, S.PLL, S.STATUS])
    usable = pc.and_(pc.equal(table[S.STATUS], S.STATUS_OK), pc.is_finite(table[S.PLL]))
    rows = table.filter(pc.fill_null(usable, False))
    if rows.num_rows == 0:
        raise UserError(f"all {table.num_rows} rows of teacher folder {folder!r} are error rows (or have no PLL): "
                        "nothing to learn from; check its `error` column")
    if not out.exists(out.path(SUMMARY_FILE)):
        logger.warning("teacher folder %s has no %s: its run may be unfinished (only the rows written are used)",
                       folder, SUMMARY_FILE)
    return Teacher(folder, rows.select([S.ID, S.TEXT, S.PLL]), table.num_rows, bool(run.get("split_chars")),
                   run.get("variant", "original"), run.get("model"))


@dataclass(frozen=True)
class MasklessJob:
    """What the training workers and the evaluation task need (torch-free, pickled to them)."""

    model: ModelSpec
    location: str
    options: TrainOptions
    steps: int
    checkpoint_every: int
    mean: float
    std: float
    meta: dict
    variant: str
    batch_tokens: int | None


def train_maskless(teacher_folder: str, model: ModelSpec, output: str, options: TrainOptions = TrainOptions(lr=LR),
                   resources: TrainResources = TrainResources(), overwrite: bool = False,
                   batch_tokens: int | None = None) -> dict:
    """Train a student on the teacher's PLLs into `output`, evaluate it on the held-out rows; returns the
    report (also DIR/report.json). Every check that needs no model weights runs before the folder is touched."""
    from ...engine.model_files import load_tokenizer

    check_bounds("--batch-tokens", batch_tokens, 1)
    teacher = read_teacher(teacher_folder)
    tokenizer, model_max = load_tokenizer(model)
    train_table, heldout_table, left_out = _split(teacher, Preparer(tokenizer, model_max, teacher.split_chars), options)
    if heldout_table.num_rows < MIN_HELDOUT:
        raise UserError(f"the held-out split has {heldout_table.num_rows} of {teacher.rows.num_rows} usable teacher rows; "
                        f"a correlation needs at least {MIN_HELDOUT}: raise --heldout or score more rows")
    if train_table.num_rows < max(options.batch_size, resources.num_workers):
        raise UserError(f"{train_table.num_rows} training rows ({left_out} over --max-length {options.max_length} left "
                        f"out) do not fill one batch of --batch-size {options.batch_size} over {resources.num_workers} "
                        "workers: lower --batch-size, raise --max-length or score more rows")
    targets = np.asarray(train_table[TARGET].to_pylist())
    run = fingerprint("maskless", model, options, {"teacher": teacher_folder, "teacher_rows": teacher.digest})
    with claimed(output, run, overwrite, [teacher_folder], [model.name]) as folder:
        out = folder.out
        out.write_table(DATA_TRAIN, train_table)
        heldout_path = out.write_table(DATA_HELDOUT, heldout_table)
        steps = options.total_steps(train_table.num_rows)
        job = MasklessJob(model, out.location, options, steps, resources.checkpoint_every, float(targets.mean()),
                          float(targets.std()) or 1.0, {"teacher": teacher_folder, "teacher_model": teacher.model,
                                                        "teacher_variant": teacher.variant, "base_model": model.name,
                                                        "split_chars": teacher.split_chars},
                          teacher.variant, batch_tokens)
        with on_ray(resources):
            fit_on_ray(maskless_worker, job, resources, out)
            folder.record_new()  # the student worker 0 saved
            evaluation = run_task(evaluate_student, resources, job, heldout_path, resources.cpus_per_worker)
        predicted = np.asarray(evaluation.pop("predicted"))
        folder.write_table(PREDICTIONS_FILE, heldout_table.select([S.ID, S.PLL]).append_column(PREDICTED, pa.array(predicted)))
        report = {
            "command": "train maskless", "teacher": teacher_folder, "teacher_model": teacher.model, "model": model.name,
            "output": output,
            "rows": {"teacher": teacher.total, "usable": teacher.rows.num_rows, "train": train_table.num_rows,
                     "heldout": heldout_table.num_rows, "left_out_over_max_length": left_out},
            "training": {**training_figures(out, steps, options, "mean squared error of the standardised PLL"),
                         "target_mean": job.mean, "target_std": job.std},
            "heldout": heldout_figures(heldout_table, train_table, predicted),
            "speed": evaluation["speed"],
        }
        out.write_json(REPORT_FILE, report)
    return report


def _split(teacher: Teacher, preparer: Preparer, options: TrainOptions) -> tuple[pa.Table, pa.Table, int]:
    """(training table, held-out table, training rows left out as longer than --max-length), tokenised.
    Held-out rows are kept whatever their length (the student reads up to the model's maximum)."""
    prepared = preparer.prepare_texts(teacher.rows[S.TEXT].to_pylist())
    held = heldout_rows(teacher.rows[S.ID].to_pylist(), options.seed, options.heldout)
    fits = np.array([p.error is None for p in prepared])
    short = np.array([p.error is None and len(p.input_ids) <= options.max_length for p in prepared])
    columns = {
        S.INPUT_IDS: pa.array([p.input_ids for p in prepared], pa.list_(pa.int32())),
        S.TARGETS: pa.array([p.targets for p in prepared], pa.list_(pa.int32())),
        S.PIECE_WORDS: pa.array([p.piece_words for p in prepared], pa.list_(pa.int32())),
    }
    table = teacher.rows
    for name, values in columns.items():
        table = table.append_column(name, values)
    train = table.filter(pa.array(~held & short)).select([S.ID, S.INPUT_IDS, S.TARGETS, S.PLL])
    train = train.rename_columns([S.ID, S.INPUT_IDS, S.TARGETS, TARGET])
    return train, table.filter(pa.array(held & fits)), int((~held & fits & ~short).sum())


def maskless_worker(config: dict) -> None:
    """One Ray Train worker: the student trained on the training split; worker 0 writes it into DIR."""
    from ...engine.maskless import regressor_for, save_student
    from ...engine.models import load_masked_lm
    from ...engine.training import MasklessObjective

    job: MasklessJob = config["job"]
    worker = start_worker(config)
    mlm = load_masked_lm(replace(job.model, device=worker.device))
    objective = MasklessObjective(regressor_for(mlm, job.mean, job.std, job.options.seed), mlm)
    train(objective, read_examples(join(job.location, DATA_TRAIN)), job, worker, "maskless")
    if worker.rank == 0:
        save_student(objective.module, mlm, job.location, job.meta)


def evaluate_student(job: MasklessJob, heldout_path: str, cpus: float) -> dict:
    """The student's predictions on every held-out row, and both scorers timed on the first
    `SPEED_SENTENCES` of them in this process (runs as a Ray task: imports torch)."""
    import torch

    from ...engine.maskless import MasklessEngine, load_student
    from ...engine.masking import Sentence
    from ...engine.models import load_masked_lm
    from ...engine.pll import PLLEngine

    set_threads(cpus)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table = pq.read_table(heldout_path)
    ids = [np.asarray(x, dtype=np.int64) for x in table[S.INPUT_IDS].to_pylist()]
    sentences = [Sentence(i, np.asarray(t, dtype=np.int64), np.asarray(w, dtype=np.int64))
                 for i, t, w in zip(ids, table[S.TARGETS].to_pylist(), table[S.PIECE_WORDS].to_pylist())]
    student = MasklessEngine(load_student(replace(job.model, name=job.location, device=device)), job.batch_tokens)
    predicted = student.predict(ids)
    teacher = PLLEngine(load_masked_lm(replace(job.model, device=device)), job.variant, job.batch_tokens)
    k = min(SPEED_SENTENCES, len(ids))
    student_s = _timed(student.predict, ids[:k])
    teacher_s = _timed(teacher.token_logprobs, sentences[:k])
    return {"predicted": predicted.tolist(), "speed": {
        "sentences": k, "device": device, "threads": torch.get_num_threads(),
        "batch_tokens": student.budget.tokens, "pll_variant": job.variant,
        "mean_tokens": float(np.mean([len(i) for i in ids[:k]])),
        "student_sentences_per_s": k / student_s, "pll_sentences_per_s": k / teacher_s, "speedup": teacher_s / student_s,
    }}


def _timed(work, items: list) -> float:
    """Seconds of `work(items)` after an untimed call on two of them (the first call pays for allocations
    and lazy set-up)."""
    work(items[:2])
    start = time.perf_counter()
    work(items)
    return time.perf_counter() - start


def heldout_figures(heldout: pa.Table, train: pa.Table, predicted: np.ndarray) -> dict:
    """Agreement of the student with the teacher on the held-out rows, and the length-only baseline."""
    teacher = np.asarray(heldout[S.PLL].to_pylist())
    tokens = np.asarray([len(t) for t in heldout[S.TARGETS].to_pylist()], dtype=np.float64)
    train_tokens = np.asarray([len(t) for t in train[S.TARGETS].to_pylist()], dtype=np.float64)
    slope, intercept = np.polyfit(train_tokens, np.asarray(train[TARGET].to_pylist()), 1) \
        if np.ptp(train_tokens) > 0 else (0.0, float(np.mean(train[TARGET].to_pylist())))
    baseline = intercept + slope * tokens
    return {
        "rows": len(teacher),
        "pearson": pearson(teacher, predicted), "spearman": spearman(teacher, predicted),
        "pearson_per_token": pearson(teacher / tokens, predicted / tokens),
        "spearman_per_token": spearman(teacher / tokens, predicted / tokens),
        "rmse": float(np.sqrt(np.mean((predicted - teacher) ** 2))), "mae": float(np.mean(np.abs(predicted - teacher))),
        "teacher_std": float(np.std(teacher)),
        "length_baseline": {"pearson": pearson(teacher, baseline),
                            "rmse": float(np.sqrt(np.mean((baseline - teacher) ** 2)))},
    }


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's r; None when either side is constant."""
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else None


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho: Pearson's r of the ranks, ties given their mean rank."""
    return pearson(_ranks(a), _ranks(b))


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse = np.unique(x, return_inverse=True)
    return (np.bincount(inverse, weights=ranks) / np.bincount(inverse))[inverse]
