"""How well and how fast a maskless student stands in for its teacher (`dscore train maskless`, after
training): the student's and `unmasked`'s predictions on the held-out rows, with the student and the PLL
engine timed on the same sentences (a Ray task: it imports torch), the student's calibration fitted on
them, their agreement with the teacher beside the length-only baseline (PLLs, per-token terms,
mutant-minus-parent differences, corpus PPPL), the N-best lists rescored with teacher, student and
`unmasked`, and report.md.

The calibration (`model_files.Calibration`: each term t -> intercept + slope * t) is fitted on every
held-out row and stored with the student. Its figures would be flattering on the rows it was fitted on
(there its corpus PPPL is the teacher's by construction), so the report's calibrated figures are
cross-fitted: the held-out families dealt into two halves, each half calibrated by the map fitted on the other.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...config import ScoringOptions
from ...engine.model_files import Calibration
from ...io import schema as S
from ...io.storage import join
from ...measures import pppl
from .run import TARGET, set_threads

if TYPE_CHECKING:  # maskless.py runs this module's tasks
    from .maskless_job import MasklessJob, NBest

RESCORE_DIR = "rescore"  # DIR/rescore/<teacher|student|unmasked>: `dscore rescore` runs of the N-best lists
# heldout_predictions.parquet's columns beside id and pll (the teacher's).
PREDICTED, PREDICTED_TOKENS = "predicted", "predicted_token_logprobs"
UNMASKED_PLL, UNMASKED_TOKENS = "unmasked", "unmasked_token_logprobs"
CALIBRATED, CALIBRATED_TOKENS = "calibrated", "calibrated_token_logprobs"  # cross-fitted, see `cross_fitted`
FOLDS = 2
CROSS_FIT = (
    "two-fold cross-fitting on the held-out rows: their families (a row and its variants, with "
    "--parent-separator) dealt at random into two halves, each half calibrated by the map fitted on the other"
)


def parent_of(row_id: str, separator: str | None) -> str:
    """The id of the row a row is a variant of: its id up to the first `separator` (itself without one)."""
    return row_id.split(separator, 1)[0] if separator else row_id


def evaluate_student(job: MasklessJob, heldout_path: str, cpus: float, speed_sentences: int) -> dict:
    """The student's and the unmasked masked LM's predictions on every held-out row, and the student and
    the PLL engine timed on the first `speed_sentences` of them in this process (a Ray task: imports torch)."""
    import torch

    from ...engine.masked_lm import load_masked_lm
    from ...engine.masking import Sentence
    from ...engine.maskless import MasklessEngine, load_student, unmasked_scorer
    from ...engine.pll import PLLEngine

    set_threads(cpus)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table = pq.read_table(heldout_path)
    sentences = [
        Sentence(np.asarray(i, dtype=np.int64), np.asarray(t, dtype=np.int64), np.asarray(w, dtype=np.int64))
        for i, t, w in zip(
            table[S.INPUT_IDS].to_pylist(), table[S.TARGETS].to_pylist(), table[S.PIECE_WORDS].to_pylist()
        )
    ]
    student = MasklessEngine(  # uncalibrated: its predictions are what the calibration is fitted on
        load_student(replace(job.model, name=job.location, device=device), calibrated=False), job.batch_tokens
    )
    unmasked = MasklessEngine(unmasked_scorer(replace(job.model, device=device)), job.batch_tokens)
    predictions = {who: engine.predict(sentences) for who, engine in (("student", student), ("unmasked", unmasked))}
    teacher = PLLEngine(load_masked_lm(replace(job.model, device=device)), job.variant, job.batch_tokens)
    k = min(speed_sentences, len(sentences))
    student_s = _timed(student.predict, sentences[:k])
    teacher_s = _timed(teacher.token_logprobs, sentences[:k])
    return {
        **{
            who: {
                "pll": [p.pll for p in values],
                "tokens": [p.token_logprobs.tolist() for p in values] if values[0].token_logprobs is not None else None,
            }
            for who, values in predictions.items()
        },
        "speed": {
            "sentences": k,
            "device": device,
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg()[0],
            "batch_tokens": student.budget.tokens,
            "pll_variant": job.variant,
            "mean_tokens": float(np.mean([len(s.input_ids) for s in sentences[:k]])),
            "student_sentences_per_s": k / student_s,
            "pll_sentences_per_s": k / teacher_s,
            "speedup": teacher_s / student_s,
            "note": "timed inside the training job: a busy machine (see load_average) lowers both; "
            "benchmarks/maskless_speed.py times them on a quiet one",
        },
    }


def _timed(work, items: list) -> float:
    """Seconds of `work(items)` after an untimed call on two of them (the first call pays for allocations
    and lazy set-up)."""
    work(items[:2])
    start = time.perf_counter()
    work(items)
    return time.perf_counter() - start


def fit_calibration(teacher: np.ndarray, predicted: np.ndarray, tokens: np.ndarray) -> Calibration | None:
    """The per-token affine map from the student's predicted PLLs to the teacher's, fitted on these rows.

    Weighted least squares of the teacher's PLL per token y = t / n on the student's x = s / n, each row
    weighted by its n tokens (a row's PLL varies about as its length; it is the fit over every token, each
    carrying its row's figures). The normal equation of the intercept is sum(t - intercept * n - slope * s)
    = 0: the calibrated PLLs sum to the teacher's, so the calibrated corpus PPPL exp(-sum PLL / sum n) is
    the teacher's on these rows, whatever their lengths. Where that fit would lift a term above 0
    (intercept > 0) or reverse the student's order (slope <= 0), the map is slope = sum(t) / sum(s) alone,
    intercept 0: the best fit that keeps both the sum and intercept <= 0. None when a sum is not below 0."""
    total_t, total_s, total_n = float(teacher.sum()), float(predicted.sum()), float(tokens.sum())
    if not (total_t < 0 and total_s < 0):
        return None
    x, y = predicted / tokens, teacher / tokens  # (R,) per token
    x_mean, y_mean = total_s / total_n, total_t / total_n  # weighted by tokens
    spread = float((tokens * (x - x_mean) ** 2).sum())
    if spread > 0:
        slope = float((tokens * (x - x_mean) * (y - y_mean)).sum()) / spread
        intercept = y_mean - slope * x_mean
        if slope > 0 and intercept <= 0:
            return Calibration(intercept, slope)
    return Calibration(0.0, total_t / total_s)


def calibration_record(calibration: Calibration, heldout: pa.Table) -> dict:
    """maskless.json's `calibration` (and the report's): the map and the rows it was fitted on."""
    return {
        "intercept": calibration.intercept,
        "slope": calibration.slope,
        "map": "each predicted term t -> intercept + slope * t: a PLL s of n tokens -> intercept * n + slope * s",
        "fitted_on": "every held-out row (weighted least squares of the teacher's PLL per token on the student's)",
        "rows": heldout.num_rows,
        "tokens": int(token_counts(heldout).sum()),
    }


def token_counts(table: pa.Table) -> np.ndarray:
    """(R,) float64: each row's scored tokens (the n of its PLL)."""
    return np.asarray([len(t) for t in table[S.TARGETS].to_pylist()], dtype=np.float64)


def cross_fitted(heldout: pa.Table, student: dict, separator: str | None, seed: int) -> dict | None:
    """The student's held-out predictions (`student`: "pll" and per-token "tokens" or None) calibrated by
    two-fold cross-fitting (CROSS_FIT); None when the held-out rows are a single family."""
    families = [parent_of(i, separator) for i in heldout[S.ID].to_pylist()]
    names = {name: k for k, name in enumerate(dict.fromkeys(families))}
    if len(names) < FOLDS:
        return None
    deal = np.random.default_rng(seed).permutation(len(names)) % FOLDS  # (families,) each one's half
    fold = deal[[names[f] for f in families]]  # (R,)
    teacher, predicted, tokens = (
        np.asarray(heldout[S.PLL].to_pylist()),
        np.asarray(student["pll"]),
        token_counts(heldout),
    )
    plls, terms = np.empty(len(fold)), None if student["tokens"] is None else [None] * len(fold)
    for k in range(FOLDS):
        other = fold != k
        calibration = fit_calibration(teacher[other], predicted[other], tokens[other])
        if calibration is None:
            return None
        mine = np.flatnonzero(fold == k)
        plls[mine] = calibration.pll(predicted[mine], tokens[mine])
        if terms is not None:
            for row in mine:
                terms[row] = calibration.terms(np.asarray(student["tokens"][row])).tolist()
    return {"pll": plls.tolist(), "tokens": terms}


def predictions_table(heldout: pa.Table, evaluation: dict, calibrated: dict | None) -> pa.Table:
    """heldout_predictions.parquet: per held-out row the teacher's PLL, the student's, its cross-fitted
    calibration (`calibrated`, absent when there is none) and `unmasked`'s (and per-token terms, for
    per-token students)."""
    table = heldout.select([S.ID, S.PLL]).append_column(PREDICTED, pa.array(evaluation["student"]["pll"], pa.float64()))
    if calibrated is not None:
        table = table.append_column(CALIBRATED, pa.array(calibrated["pll"], pa.float64()))
    table = table.append_column(UNMASKED_PLL, pa.array(evaluation["unmasked"]["pll"], pa.float64()))
    if evaluation["student"]["tokens"] is not None:
        table = table.append_column(PREDICTED_TOKENS, pa.array(evaluation["student"]["tokens"], pa.list_(pa.float64())))
        if calibrated is not None:
            table = table.append_column(CALIBRATED_TOKENS, pa.array(calibrated["tokens"], pa.list_(pa.float64())))
    return table.append_column(UNMASKED_TOKENS, pa.array(evaluation["unmasked"]["tokens"], pa.list_(pa.float64())))


def heldout_figures(heldout: pa.Table, train: pa.Table, predictions: pa.Table, separator: str | None) -> dict:
    """Agreement with the teacher on the held-out rows: the student's (raw and, where the predictions hold
    it, calibrated), `unmasked`'s and the length-only baseline's, side by side, and their corpus PPPLs."""
    teacher, tokens, train_tokens = np.asarray(heldout[S.PLL].to_pylist()), token_counts(heldout), token_counts(train)
    slope, intercept = (
        np.polyfit(train_tokens, np.asarray(train[TARGET].to_pylist()), 1)
        if np.ptp(train_tokens) > 0
        else (0.0, float(np.mean(train[TARGET].to_pylist())))
    )
    pairs = mutant_pairs(heldout[S.ID].to_pylist(), separator)
    terms = heldout[S.TOKEN_LOGPROBS].to_pylist() if S.TOKEN_LOGPROBS in heldout.column_names else None
    columns = predictions.column_names

    def scorer(pll_column: str, token_column: str) -> tuple[np.ndarray, list | None]:
        per_token = predictions[token_column].to_pylist() if token_column in columns else None
        return np.asarray(predictions[pll_column].to_pylist()), per_token

    scorers = {
        "student": scorer(PREDICTED, PREDICTED_TOKENS),
        **({"calibrated": scorer(CALIBRATED, CALIBRATED_TOKENS)} if CALIBRATED in columns else {}),
        "unmasked": scorer(UNMASKED_PLL, UNMASKED_TOKENS),
        "length_baseline": (intercept + slope * tokens, None),
    }
    figures = {
        name: agreement(teacher, predicted, tokens, terms, predicted_terms, pairs)
        for name, (predicted, predicted_terms) in scorers.items()
    }
    return {
        "rows": len(teacher),
        "teacher_std": float(np.std(teacher)),
        "mutant_pairs": len(pairs),
        **figures,
        "corpus_pppl": corpus_pppls(teacher, {name: predicted for name, (predicted, _) in scorers.items()}, tokens),
    }


def corpus_pppls(teacher: np.ndarray, scorers: dict[str, np.ndarray], tokens: np.ndarray) -> dict:
    """The held-out rows' corpus PPPL, exp(-sum PLL / sum tokens), of the teacher and of each scorer, and
    each scorer's relative gap to the teacher's (PPPL / teacher's PPPL - 1): the bias an audit of these
    rows would carry. `calibrated` is cross-fitted (CROSS_FIT)."""
    count = int(tokens.sum())
    reference = pppl(float(teacher.sum()), count)
    figures = {name: pppl(float(predicted.sum()), count) for name, predicted in scorers.items()}
    return {
        "tokens": count,
        "teacher": reference,
        **figures,
        "gap": {name: value / reference - 1 for name, value in figures.items()},
        **({"calibrated_by": CROSS_FIT} if "calibrated" in scorers else {}),
    }


def agreement(
    teacher: np.ndarray,
    predicted: np.ndarray,
    tokens: np.ndarray,
    terms: list | None,
    predicted_terms: list | None,
    pairs: list[tuple[int, int]],
) -> dict:
    """One scorer against the teacher: Pearson and Spearman of the PLL and of the PLL per token, RMSE and MAE
    (nats), the per-token terms pooled over every held-out token (per-token scorers), the mutant-minus-parent
    differences, and how many predictions are above 0 (none can be)."""
    out = {
        "pearson": pearson(teacher, predicted),
        "spearman": spearman(teacher, predicted),
        "pearson_per_token": pearson(teacher / tokens, predicted / tokens),
        "spearman_per_token": spearman(teacher / tokens, predicted / tokens),
        "rmse": float(np.sqrt(np.mean((predicted - teacher) ** 2))),
        "mae": float(np.mean(np.abs(predicted - teacher))),
        "above_zero": int((predicted > 0).sum()),
    }
    if terms is not None and predicted_terms is not None:
        a, b = np.concatenate([np.asarray(t) for t in terms]), np.concatenate([np.asarray(t) for t in predicted_terms])
        out["token_terms"] = {
            "tokens": len(a),
            "pearson": pearson(a, b),
            "spearman": spearman(a, b),
            "rmse": float(np.sqrt(np.mean((a - b) ** 2))),
        }
    if pairs:
        mutant, parent = np.array(pairs).T
        a, b = teacher[mutant] - teacher[parent], predicted[mutant] - predicted[parent]
        out["mutant_minus_parent"] = {
            "pairs": len(pairs),
            "pearson": pearson(a, b),
            "spearman": spearman(a, b),
            "rmse": float(np.sqrt(np.mean((a - b) ** 2))),
            "sign_agreement": float(np.mean(np.sign(a) == np.sign(b))),
        }
    return out


def mutant_pairs(ids: list[str], separator: str | None) -> list[tuple[int, int]]:
    """(mutant row, parent row) for every held-out row whose parent (`parent_of`) is held out too."""
    if not separator:
        return []
    index = {row_id: i for i, row_id in enumerate(ids)}
    return [
        (i, index[parent_of(row_id, separator)])
        for i, row_id in enumerate(ids)
        if parent_of(row_id, separator) != row_id and parent_of(row_id, separator) in index
    ]


def summary_of(heldout: dict) -> dict:
    """What maskless.json (and a run scored with the student) keeps of the held-out figures: those of the
    predictions `dscore score --maskless` gives (`calibrated`, cross-fitted, where there is a calibration),
    and their corpus PPPL's gap to the teacher's."""
    scorer = "calibrated" if "calibrated" in heldout else "student"
    student = heldout[scorer]
    keep = ("pearson", "spearman", "rmse", "mae", "pearson_per_token")
    return {
        "rows": heldout["rows"],
        "teacher_std": heldout["teacher_std"],
        "scorer": scorer,
        **{k: student[k] for k in keep},
        "mutant_minus_parent_spearman": student.get("mutant_minus_parent", {}).get("spearman"),
        "corpus_pppl_gap": heldout["corpus_pppl"]["gap"][scorer],
    }


def rescore_lists(job: MasklessJob, nbest: NBest, cpus: float) -> dict:
    """The N-best lists rescored with the teacher's PLL, the student and `unmasked`, into DIR/rescore/<who>:
    resumable `dscore rescore` runs, in this process (a Ray task, as the evaluation: three small scoring
    runs cost less here than three Ray Data pipelines); each one's lambda and dev and test figures."""
    from ..rescore.run import RescoreInputs, rescore_nbest
    from ..rescore.search import RescoreOptions

    set_threads(cpus)
    scoring = ScoringOptions(job.variant, job.batch_tokens, split_chars=bool(job.meta["split_chars"]))
    scorers = {
        "teacher": (job.model, "pll"),
        "student": (replace(job.model, name=job.location), "maskless"),
        "unmasked": (job.model, "unmasked"),
    }
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

    lines = [
        f"# Maskless student (`{report['target']}`) of {report['teacher_model'] or report['teacher']}",
        "",
        f"{report['rows']['train']} training rows, {t['steps']} steps of {t['batch_size']}; {h['rows']} held-out "
        f"rows ({h['mutant_pairs']} mutant-parent pairs); teacher PLL std {h['teacher_std']:.2f} nats.",
        "",
        "| scorer | Pearson | Spearman | Pearson per token | RMSE (nats) | token terms r | "
        "mutant - parent rho | above 0 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"student": "student", "calibrated": "student, calibrated", "unmasked": "unmasked"}
    for name in [n for n in (*names, "length_baseline") if n in h]:
        f = h[name]
        lines.append(
            f"| {names.get(name, name)} | {number(f['pearson'])} | {number(f['spearman'])} | "
            f"{number(f['pearson_per_token'])} | "
            f"{number(f['rmse'], 2)} | {number(f.get('token_terms', {}).get('pearson'))} | "
            f"{number(f.get('mutant_minus_parent', {}).get('spearman'))} | {f['above_zero']} |"
        )
    c = h["corpus_pppl"]
    lines += [
        "",
        f"Corpus PPPL of the held-out rows ({c['tokens']} tokens): teacher {c['teacher']:.3f}; "
        + "; ".join(f"{names[n]} {c[n]:.3f} ({100 * c['gap'][n]:+.1f} %)" for n in names if n in c)
        + (f". Calibrated by {c['calibrated_by']}." if "calibrated_by" in c else "; no calibration."),
    ]
    if report["rescoring"]:
        r = report["rescoring"]
        lines += [
            "",
            f"## N-best rescoring ({r['metric']}, test)",
            "",
            "| scorer | baseline | rescored | oracle | lambda |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {who} | {r[who]['test']['baseline']:.4f} | {r[who]['test']['rescored']:.4f} | "
            f"{r[who]['test']['oracle']:.4f} | {r[who]['lambda']:.2f} |"
            for who in ("teacher", "student", "unmasked")
        ]
    lines += [
        "",
        f"Speed ({s['device']}, {s['threads']} threads, load average {s['load_average']:.1f}, {s['sentences']} "
        f"held-out rows of {s['mean_tokens']:.0f} tokens): student {s['student_sentences_per_s']:.2f} rows/s, "
        f"PLL {s['pll_sentences_per_s']:.2f} rows/s, {s['speedup']:.1f}x.",
    ]
    return "\n".join(lines) + "\n"
