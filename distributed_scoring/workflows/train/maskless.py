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
held-out sentences in one process.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...config import ModelSpec, ScoringOptions, check_bounds
from ...engine.model_files import STUDENT_FILE, TARGET_DISTRIBUTION, TARGET_SENTENCE, TARGET_TOKEN, TARGETS
from ...errors import UserError
from ...io import schema as S
from ...io.claim import claim_training
from ...io.output import ROWS_DIR, RUN_FILE, SUMMARY_FILE, OutputDir
from ...io.storage import join
from ...workloads.maskless import RANGE
from ...workloads.prepare import PLLPreparer
from ..maskless import HELDOUT
from .run import (
    DATA_HELDOUT, DATA_TRAIN, REPORT_FILE, TARGET, TOKEN_TARGETS, TRAINING_OUTPUTS, TrainOptions, TrainResources,
    fit_on_ray, heldout_rows, on_ray, read_examples, run_task, set_threads, start_worker, train, training_figures,
    training_fingerprint,
)

logger = logging.getLogger(__name__)

LR = 1e-4  # default peak learning rate of the encoder (the paper used 1e-5 over 10 epochs of LibriSpeech text; the head learns faster, see engine.training)
DEFAULT_TARGET = TARGET_DISTRIBUTION  # the target that won on the demo's held-out report (docs/train.md)
PREDICTIONS_FILE = "heldout_predictions.parquet"
REPORT_MD = "report.md"
RESCORE_DIR = "rescore"  # DIR/rescore/<teacher|student|unmasked>: `dscore rescore` runs of the N-best lists
# heldout_predictions.parquet's columns beside id and pll (the teacher's).
PREDICTED, PREDICTED_TOKENS = "predicted", "predicted_token_logprobs"
UNMASKED_PLL, UNMASKED_TOKENS = "unmasked", "unmasked_token_logprobs"
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
            raise UserError(f"--freeze-layers and --token-weight must be >= 0, got {self.freeze_layers} and "
                            f"{self.token_weight}")

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
    missing = [c for c in TEACHER_COLUMNS if c not in columns]
    if missing:
        raise UserError(f"the teacher's rows ({files[0]}) have no {', '.join(missing)} column(s) (they have "
                        f"{', '.join(columns)}): pass the folder of a PLL run (`dscore score`)")
    wanted = [*TEACHER_COLUMNS, *(c for c in (*TEACHER_TOKENS, *TEACHER_CONDITIONALS) if c in columns)]
    table = pq.read_table(files, filesystem=out.fs, columns=wanted)
    usable = pc.and_(pc.equal(table[S.STATUS], S.STATUS_OK), pc.is_finite(table[S.PLL]))
    rows = table.filter(pc.fill_null(usable, False))
    if rows.num_rows == 0:
        raise UserError(f"all {table.num_rows} rows of teacher folder {folder!r} are error rows (or have no PLL): "
                        "nothing to learn from; check its `error` column")
    if not out.exists(out.path(SUMMARY_FILE)):
        logger.warning("teacher folder %s has no %s: its run may be unfinished (only the rows written are used)",
                       folder, SUMMARY_FILE)
    return Teacher(folder, rows.drop_columns([S.STATUS]), table.num_rows, bool(run.get("split_chars")),
                   run.get("variant", "original"), run.get("model"))


def check_teacher_has(teacher: Teacher, student: StudentOptions) -> None:
    """A per-token target needs the teacher's per-token terms, `distribution` its conditionals too."""
    if student.target != TARGET_SENTENCE and not teacher.has(TEACHER_TOKENS):
        raise UserError(f"--target {student.target} needs the teacher's per-token scores, and teacher folder "
                        f"{teacher.folder!r} has none: score it with `dscore score --per-token`")
    if student.target == TARGET_DISTRIBUTION and not teacher.has(TEACHER_CONDITIONALS):
        raise UserError(f"--target distribution needs the teacher's conditionals, and teacher folder {teacher.folder!r} "
                        "has none: score it with `dscore score --per-token --conditionals K` (K >= the vocabulary "
                        "for all of it; see docs/train.md)")


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


def train_maskless(teacher_folder: str, model: ModelSpec, output: str, options: TrainOptions = TrainOptions(lr=LR),
                   resources: TrainResources = TrainResources(), overwrite: bool = False,
                   batch_tokens: int | None = None, student: StudentOptions = StudentOptions(),
                   nbest: NBest | None = None, speed_sentences: int = SPEED_SENTENCES) -> dict:
    """Train a student on the teacher into `output`, evaluate it on the held-out rows; returns the report
    (also DIR/report.json and DIR/report.md). The student and the PLL engine are timed on the first
    `speed_sentences` held-out rows (at least 2). Every check that needs no model weights runs before the
    folder is touched."""
    from ...engine.model_files import load_tokenizer

    check_bounds("--batch-tokens", batch_tokens, 1)
    teacher = read_teacher(teacher_folder)
    check_teacher_has(teacher, student)
    tokenizer, model_max = load_tokenizer(model)
    train_table, heldout_table, left_out = _split(teacher, PLLPreparer(tokenizer, model_max, teacher.split_chars),
                                                  options, student)
    if heldout_table.num_rows < MIN_HELDOUT:
        raise UserError(f"the held-out split has {heldout_table.num_rows} of {teacher.rows.num_rows} usable teacher rows; "
                        f"a correlation needs at least {MIN_HELDOUT}: raise --heldout or score more rows")
    if train_table.num_rows < max(options.batch_size, resources.num_workers):
        raise UserError(f"{train_table.num_rows} training rows ({left_out} over --max-length {options.max_length} left "
                        f"out) do not fill one batch of --batch-size {options.batch_size} over {resources.num_workers} "
                        "workers: lower --batch-size, raise --max-length or score more rows")
    if nbest is not None:
        _check_nbest(nbest)
    if speed_sentences < 2:
        raise UserError(f"--speed-sentences must be at least 2 (one untimed warm-up call takes two), got {speed_sentences}")
    targets = np.asarray(train_table[TARGET].to_pylist())
    per_token = targets / np.asarray([len(t) for t in train_table[S.TARGETS].to_pylist()])
    run = training_fingerprint("maskless", model, options, {
        "teacher": teacher_folder, "teacher_rows": teacher.digest, **asdict(student),
        "nbest": asdict(nbest) if nbest else None})
    inputs = [teacher_folder, *([p for p in (nbest.dev, nbest.test) if p] if nbest else [])]
    with claim_training(output, run, overwrite, inputs, [model.name], TRAINING_OUTPUTS) as folder:
        out = folder.out
        out.write_table(DATA_TRAIN, train_table)
        heldout_path = out.write_table(DATA_HELDOUT, heldout_table)
        steps = options.total_steps(train_table.num_rows)
        meta = {"target": student.target, "teacher": teacher_folder, "teacher_model": teacher.model,
                "teacher_variant": teacher.variant, "teacher_rows": teacher.digest, "base_model": model.name,
                "split_chars": teacher.split_chars, RANGE: {"pll_per_token": [float(per_token.min()), float(per_token.max())]}}
        job = MasklessJob(model, out.location, options, student, steps, resources.checkpoint_every,
                          float(targets.mean()), float(targets.std()) or 1.0, meta, teacher.variant, batch_tokens)
        with on_ray(resources):
            fit_on_ray(maskless_worker, job, resources, out)
            folder.record_new()  # the student worker 0 saved
            evaluation = run_task(evaluate_student, resources, job, heldout_path, resources.cpus_per_worker,
                                  speed_sentences)
            if nbest:
                folder.record(RESCORE_DIR)  # before the task's rescoring runs write there
            rescored = run_task(rescore_lists, resources, job, nbest, resources.cpus_per_worker) if nbest else None
        predictions = _predictions(heldout_table, evaluation)
        folder.write_table(PREDICTIONS_FILE, predictions)
        heldout = heldout_figures(heldout_table, train_table, predictions, student.parent_separator)
        folder.write_json(STUDENT_FILE, {**out.read_json(STUDENT_FILE), HELDOUT: _summary_of(heldout)})
        report = {
            "command": "train maskless", "target": student.target, "teacher": teacher_folder,
            "teacher_model": teacher.model, "model": model.name, "output": output,
            "rows": {"teacher": teacher.total, "usable": teacher.rows.num_rows, "train": train_table.num_rows,
                     "heldout": heldout_table.num_rows, "left_out_over_max_length": left_out},
            "training": {**training_figures(out, steps, options, LOSSES[student.target]),
                         "target_mean": job.mean, "target_std": job.std, **asdict(student),
                         "training_range": meta[RANGE]},
            "heldout": heldout,
            "rescoring": rescored,
            "speed": evaluation["speed"],
        }
        folder.write_json(REPORT_FILE, report)
        folder.write_text(REPORT_MD, render_report(report))
    return report


LOSSES = {
    TARGET_SENTENCE: "mean squared error of the predicted PLL over the teacher's std",
    TARGET_TOKEN: "mean squared error of log q_t(w_t) against the teacher's log p(w_t | W without w_t), per token",
    TARGET_DISTRIBUTION: "KL(p_teacher(.|W without w_t) || q_t) per token, plus token_weight times the token term",
}


def parent_of(row_id: str, separator: str | None) -> str:
    """The id of the row a row is a variant of: its id up to the first `separator` (itself without one)."""
    return row_id.split(separator, 1)[0] if separator else row_id


def _split(teacher: Teacher, preparer: PLLPreparer, options: TrainOptions,
           student: StudentOptions) -> tuple[pa.Table, pa.Table, int]:
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
    heldout_columns = [S.ID, S.TEXT, S.PLL, S.INPUT_IDS, S.TARGETS, S.PIECE_WORDS,
                       *([S.TOKEN_LOGPROBS] if teacher.has(TEACHER_TOKENS) else [])]
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
            raise UserError(f"row {row_id!r}: the teacher scored {count} tokens ({' '.join((scored or [])[:8])} ...), "
                            f"--model's tokenizer gives {len(mine)} ({' '.join(mine[:8])} ...): a student must use its "
                            "teacher's tokenizer; pass the teacher's model (or one fine-tuned from it) as --model")


def _check_nbest(nbest: NBest) -> None:
    for name, path in (("--nbest-dev", nbest.dev), ("--nbest-test", nbest.test)):
        if not OutputDir(path).exists(path):
            raise UserError(f"{name} {path!r} does not exist: pass an N-best list (JSONL, Parquet or ESPnet JSON, "
                            "as `dscore rescore` reads it)")


def maskless_worker(config: dict) -> None:
    """One Ray Train worker: the student trained on the training split; worker 0 writes it into DIR."""
    from ...engine.maskless import regressor_for, save_student
    from ...engine.masked_lm import load_masked_lm
    from ...engine.training import SentenceObjective, TokenObjective, freeze_lower

    job: MasklessJob = config["job"]
    worker = start_worker(config)
    mlm = load_masked_lm(replace(job.model, device=worker.device))
    freeze_lower(mlm.model, job.student.freeze_layers)
    regressor = regressor_for(mlm, job.mean, job.std, job.options.seed) if job.student.target == TARGET_SENTENCE else None
    objective = SentenceObjective(regressor, mlm) if regressor is not None else TokenObjective(mlm, *job.student.weights)
    train(objective, read_examples(join(job.location, DATA_TRAIN)), job, worker, "maskless")
    if worker.rank == 0:
        save_student(mlm, job.location, job.meta, regressor)


def evaluate_student(job: MasklessJob, heldout_path: str, cpus: float, speed_sentences: int) -> dict:
    """The student's and the unmasked masked LM's predictions on every held-out row, and the student and
    the PLL engine timed on the first `speed_sentences` of them in this process (a Ray task: imports torch)."""
    import torch

    from ...engine.maskless import MasklessEngine, load_student, unmasked_scorer
    from ...engine.masking import Sentence
    from ...engine.masked_lm import load_masked_lm
    from ...engine.pll import PLLEngine

    set_threads(cpus)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table = pq.read_table(heldout_path)
    sentences = [Sentence(np.asarray(i, dtype=np.int64), np.asarray(t, dtype=np.int64), np.asarray(w, dtype=np.int64))
                 for i, t, w in zip(table[S.INPUT_IDS].to_pylist(), table[S.TARGETS].to_pylist(),
                                    table[S.PIECE_WORDS].to_pylist())]
    student = MasklessEngine(load_student(replace(job.model, name=job.location, device=device)), job.batch_tokens)
    unmasked = MasklessEngine(unmasked_scorer(replace(job.model, device=device)), job.batch_tokens)
    predictions = {who: engine.predict(sentences) for who, engine in (("student", student), ("unmasked", unmasked))}
    teacher = PLLEngine(load_masked_lm(replace(job.model, device=device)), job.variant, job.batch_tokens)
    k = min(speed_sentences, len(sentences))
    student_s = _timed(student.predict, sentences[:k])
    teacher_s = _timed(teacher.token_logprobs, sentences[:k])
    return {**{who: {"pll": [p.pll for p in values],
                     "tokens": [p.token_logprobs.tolist() for p in values] if values[0].token_logprobs is not None else None}
               for who, values in predictions.items()},
            "speed": {
                "sentences": k, "device": device, "threads": torch.get_num_threads(),
                "load_average": os.getloadavg()[0], "batch_tokens": student.budget.tokens, "pll_variant": job.variant,
                "mean_tokens": float(np.mean([len(s.input_ids) for s in sentences[:k]])),
                "student_sentences_per_s": k / student_s, "pll_sentences_per_s": k / teacher_s,
                "speedup": teacher_s / student_s,
                "note": "timed inside the training job: a busy machine (see load_average) lowers both; "
                        "benchmarks/maskless_speed.py times them on a quiet one"}}


def _timed(work, items: list) -> float:
    """Seconds of `work(items)` after an untimed call on two of them (the first call pays for allocations
    and lazy set-up)."""
    work(items[:2])
    start = time.perf_counter()
    work(items)
    return time.perf_counter() - start


def _predictions(heldout: pa.Table, evaluation: dict) -> pa.Table:
    """heldout_predictions.parquet: per held-out row the teacher's PLL, the student's and `unmasked`'s
    (and the student's per-token terms, for per-token students)."""
    table = heldout.select([S.ID, S.PLL]).append_column(PREDICTED, pa.array(evaluation["student"]["pll"], pa.float64()))
    table = table.append_column(UNMASKED_PLL, pa.array(evaluation["unmasked"]["pll"], pa.float64()))
    if evaluation["student"]["tokens"] is not None:
        table = table.append_column(PREDICTED_TOKENS, pa.array(evaluation["student"]["tokens"], pa.list_(pa.float64())))
    return table.append_column(UNMASKED_TOKENS, pa.array(evaluation["unmasked"]["tokens"], pa.list_(pa.float64())))


def heldout_figures(heldout: pa.Table, train: pa.Table, predictions: pa.Table, separator: str | None) -> dict:
    """Agreement with the teacher on the held-out rows: the student's, `unmasked`'s and the length-only
    baseline's, side by side."""
    teacher = np.asarray(heldout[S.PLL].to_pylist())
    tokens = np.asarray([len(t) for t in heldout[S.TARGETS].to_pylist()], dtype=np.float64)
    train_tokens = np.asarray([len(t) for t in train[S.TARGETS].to_pylist()], dtype=np.float64)
    slope, intercept = np.polyfit(train_tokens, np.asarray(train[TARGET].to_pylist()), 1) \
        if np.ptp(train_tokens) > 0 else (0.0, float(np.mean(train[TARGET].to_pylist())))
    pairs = mutant_pairs(heldout[S.ID].to_pylist(), separator)
    terms = heldout[S.TOKEN_LOGPROBS].to_pylist() if S.TOKEN_LOGPROBS in heldout.column_names else None
    scorers = {
        "student": (np.asarray(predictions[PREDICTED].to_pylist()),
                    predictions[PREDICTED_TOKENS].to_pylist() if PREDICTED_TOKENS in predictions.column_names else None),
        "unmasked": (np.asarray(predictions[UNMASKED_PLL].to_pylist()), predictions[UNMASKED_TOKENS].to_pylist()),
        "length_baseline": (intercept + slope * tokens, None),
    }
    figures = {name: agreement(teacher, predicted, tokens, terms, predicted_terms, pairs)
               for name, (predicted, predicted_terms) in scorers.items()}
    return {"rows": len(teacher), "teacher_std": float(np.std(teacher)), "mutant_pairs": len(pairs), **figures}


def agreement(teacher: np.ndarray, predicted: np.ndarray, tokens: np.ndarray, terms: list | None,
              predicted_terms: list | None, pairs: list[tuple[int, int]]) -> dict:
    """One scorer against the teacher: Pearson and Spearman of the PLL and of the PLL per token, RMSE and MAE
    (nats), the per-token terms pooled over every held-out token (per-token scorers), the mutant-minus-parent
    differences, and how many predictions are above 0 (none can be)."""
    out = {
        "pearson": pearson(teacher, predicted), "spearman": spearman(teacher, predicted),
        "pearson_per_token": pearson(teacher / tokens, predicted / tokens),
        "spearman_per_token": spearman(teacher / tokens, predicted / tokens),
        "rmse": float(np.sqrt(np.mean((predicted - teacher) ** 2))), "mae": float(np.mean(np.abs(predicted - teacher))),
        "above_zero": int((predicted > 0).sum()),
    }
    if terms is not None and predicted_terms is not None:
        a, b = np.concatenate([np.asarray(t) for t in terms]), np.concatenate([np.asarray(t) for t in predicted_terms])
        out["token_terms"] = {"tokens": len(a), "pearson": pearson(a, b), "spearman": spearman(a, b),
                              "rmse": float(np.sqrt(np.mean((a - b) ** 2)))}
    if pairs:
        mutant, parent = np.array(pairs).T
        a, b = teacher[mutant] - teacher[parent], predicted[mutant] - predicted[parent]
        out["mutant_minus_parent"] = {"pairs": len(pairs), "pearson": pearson(a, b), "spearman": spearman(a, b),
                                      "rmse": float(np.sqrt(np.mean((a - b) ** 2))),
                                      "sign_agreement": float(np.mean(np.sign(a) == np.sign(b)))}
    return out


def mutant_pairs(ids: list[str], separator: str | None) -> list[tuple[int, int]]:
    """(mutant row, parent row) for every held-out row whose parent (`parent_of`) is held out too."""
    if not separator:
        return []
    index = {row_id: i for i, row_id in enumerate(ids)}
    return [(i, index[parent_of(row_id, separator)]) for i, row_id in enumerate(ids)
            if parent_of(row_id, separator) != row_id and parent_of(row_id, separator) in index]


def _summary_of(heldout: dict) -> dict:
    """What maskless.json (and a run scored with the student) keeps of the held-out figures."""
    student = heldout["student"]
    keep = ("pearson", "spearman", "rmse", "mae", "pearson_per_token")
    return {"rows": heldout["rows"], "teacher_std": heldout["teacher_std"], **{k: student[k] for k in keep},
            "mutant_minus_parent_spearman": student.get("mutant_minus_parent", {}).get("spearman")}


def rescore_lists(job: MasklessJob, nbest: NBest, cpus: float) -> dict:
    """The N-best lists rescored with the teacher's PLL, the student and `unmasked`, into DIR/rescore/<who>:
    resumable `dscore rescore` runs, in this process (a Ray task, as the evaluation: three small scoring
    runs cost less here than three Ray Data pipelines); each one's lambda and dev and test figures."""
    from ..rescore.rescoring import RescoreOptions
    from ..rescore.run import RescoreInputs, rescore_nbest

    set_threads(cpus)
    scoring = ScoringOptions(job.variant, job.batch_tokens, split_chars=bool(job.meta["split_chars"]))
    scorers = {"teacher": (job.model, "pll"), "student": (replace(job.model, name=job.location), "maskless"),
               "unmasked": (job.model, "unmasked")}
    figures = {}
    for who, (model, method) in scorers.items():
        inputs = RescoreInputs(nbest.dev, nbest.test, join(job.location, f"{RESCORE_DIR}/{who}"))
        report = rescore_nbest(inputs, model, None, scoring, RescoreOptions(metric=nbest.metric), method=method).report
        figures[who] = {"lambda": report["lambda"], "dev": report["dev"], "test": report["test"]}
    return {"metric": nbest.metric, "dev": nbest.dev, "test": nbest.test, **figures}


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


def render_report(report: dict) -> str:
    """report.md: the held-out table (student, `unmasked`, length-only baseline), the rescoring and the speed."""
    h, s, t = report["heldout"], report["speed"], report["training"]

    def number(value: float | None, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    lines = [f"# Maskless student (`{report['target']}`) of {report['teacher_model'] or report['teacher']}", "",
             f"{report['rows']['train']} training rows, {t['steps']} steps of {t['batch_size']}; {h['rows']} held-out "
             f"rows ({h['mutant_pairs']} mutant-parent pairs); teacher PLL std {h['teacher_std']:.2f} nats.", "",
             "| scorer | Pearson | Spearman | Pearson per token | RMSE (nats) | token terms r | mutant - parent rho | above 0 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("student", "unmasked", "length_baseline"):
        f = h[name]
        lines.append(f"| {name} | {number(f['pearson'])} | {number(f['spearman'])} | {number(f['pearson_per_token'])} | "
                     f"{number(f['rmse'], 2)} | {number(f.get('token_terms', {}).get('pearson'))} | "
                     f"{number(f.get('mutant_minus_parent', {}).get('spearman'))} | {f['above_zero']} |")
    if report["rescoring"]:
        r = report["rescoring"]
        lines += ["", f"## N-best rescoring ({r['metric']}, test)", "", "| scorer | baseline | rescored | oracle | lambda |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {who} | {r[who]['test']['baseline']:.4f} | {r[who]['test']['rescored']:.4f} | "
                  f"{r[who]['test']['oracle']:.4f} | {r[who]['lambda']:.2f} |" for who in ("teacher", "student", "unmasked")]
    lines += ["", f"Speed ({s['device']}, {s['threads']} threads, load average {s['load_average']:.1f}, {s['sentences']} "
              f"held-out rows of {s['mean_tokens']:.0f} tokens): student {s['student_sentences_per_s']:.2f} rows/s, "
              f"PLL {s['pll_sentences_per_s']:.2f} rows/s, {s['speedup']:.1f}x."]
    return "\n".join(lines) + "\n"
