"""ProteinGym's figures, computed as its `performance_DMS_benchmarks.py` (the `proteingym` 1.3 package) computes
them, so that a number here can be set beside a number on its leaderboard. Numpy only.

Per assay (and per mutation depth: the number of `:`-separated parts of `mutant`, 5 and more together as "5+"):
    spearman     Spearman's rho of the score with `DMS_score` (scipy's `spearmanr`)
    auc          ROC AUC of the score for `DMS_score_bin` (sklearn's `roc_auc_score`)
    mcc          Matthews' correlation of `DMS_score_bin` with the score cut at its median over the whole assay
                 (score >= median is 1; sklearn's `matthews_corrcoef`)
    ndcg         NDCG of the top floor(10% of n) by score, gains `DMS_score` min-max scaled (its `calc_ndcg`)
    top_recall   of the top 10% by `DMS_score` (>= its 90th percentile), the share also in the top 10% by score
                 (its `calc_toprecall`)
Across assays (`benchmark`): each assay's figure rounded to 3 decimals, averaged per (UniProt ID, selection
type), those averaged per selection type, and the types averaged; the standard error of that average by
resampling the (UniProt ID, selection type) groups within each type, 10,000 times.

ProteinGym's quirks are kept, each where its figure is computed: MCC is 0 (not undefined) when the labels or the
cut scores hold one class; NDCG is 0 below 10 variants (its top 10% holds none); top recall is 1 for constant
scores (every variant is in their top 10%); ties in NDCG's ranking are broken by numpy's default argsort, as
theirs are; by depth, MCC cuts at the whole assay's median, not the depth's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats import auc as mann_whitney_auc
from .stats import spearman as rank_correlation

METRICS = ("spearman", "auc", "mcc", "ndcg", "top_recall")
DEPTHS = ("1", "2", "3", "4", "5+")
TOP_PERCENT = 10  # NDCG's and top recall's top
RESHUFFLES = 10_000  # bootstrap resamples of the assays, as ProteinGym draws
SEED = 0
DECIMALS = 3  # ProteinGym rounds each assay's figure before it averages them


@dataclass(frozen=True)
class Figure:
    """One of ProteinGym's figures; `reason` says why `value` is None, `note` why a value is a convention of
    ProteinGym's rather than a measure (an MCC of 0 for one class)."""

    value: float | None
    reason: str | None = None
    note: str | None = None

    def to_dict(self) -> dict:
        return {"value": self.value, **{k: v for k, v in (("reason", self.reason), ("note", self.note)) if v}}


def depth_group(mutant: str) -> str:
    """ProteinGym's mutation depth of a `mutant` name: its parts, 5 and more as '5+'."""
    depth = len(mutant.split(":"))
    return "5+" if depth >= 5 else str(depth)


def spearman(measured: np.ndarray, scores: np.ndarray) -> Figure:
    if len(scores) < 2:
        return Figure(None, f"{len(scores)} variant(s) scored and measured: Spearman needs 2")
    value = rank_correlation(scores, measured)
    return Figure(None, "constant scores or DMS_score: Spearman is undefined") if value is None else Figure(value)


def auc(labels: np.ndarray, scores: np.ndarray) -> Figure:
    if not np.isin(labels, (0, 1)).all():
        return Figure(None, "DMS_score_bin holds values other than 0 and 1")
    value = mann_whitney_auc(scores, labels)
    return Figure(None, "DMS_score_bin has one class only: the AUC is undefined") if value is None else Figure(value)


def mcc(labels: np.ndarray, predicted: np.ndarray) -> Figure:
    """Matthews' correlation as sklearn's `matthews_corrcoef` computes it from the confusion matrix, 0 where its
    denominator is (one class in the labels or in the predictions)."""
    if not len(labels):
        return Figure(None, "no variant scored with a DMS_score_bin")
    if not np.isin(labels, (0, 1)).all():
        return Figure(None, "DMS_score_bin holds values other than 0 and 1")
    n = len(labels)
    truth = np.array([(labels == 0).sum(), (labels == 1).sum()], dtype=float)  # the confusion matrix's row sums
    said = np.array([(predicted == 0).sum(), (predicted == 1).sum()], dtype=float)  # its column sums
    correct = float((labels == predicted).sum())
    cov_ytyp = correct * n - truth @ said
    cov_ypyp, cov_ytyt = n * n - said @ said, n * n - truth @ truth
    if cov_ypyp * cov_ytyt == 0:
        return Figure(0.0, note="one class in DMS_score_bin or in the cut scores: ProteinGym's MCC is 0")
    return Figure(float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp)))


def ndcg(measured: np.ndarray, scores: np.ndarray) -> Figure:
    """ProteinGym's `calc_ndcg`: the top k = floor(n * 10 / 100) by score, gains the min-max scaled `DMS_score`,
    gains of 0 left out, normalised by the top k gains' own DCG."""
    if not len(scores):
        return Figure(None, "no variant scored and measured")
    k = int(np.floor(len(measured) * (TOP_PERCENT / 100)))
    if k == 0:
        return Figure(0.0, note=f"fewer than {100 // TOP_PERCENT} variants: ProteinGym's NDCG of an empty top is 0")
    spread = np.max(measured) - np.min(measured)
    if spread == 0:
        return Figure(None, "constant DMS_score: its min-max gains are undefined")
    gains = (measured - np.min(measured)) / spread
    dcg = _dcg(np.argsort(np.argsort(-scores)) + 1, gains, k)
    if dcg is None:
        return Figure(0.0)  # no gain in the model's top k: ProteinGym returns 0 before its ideal DCG
    ideal = _dcg(np.argsort(np.argsort(-gains)) + 1, gains, k)
    return Figure(float(dcg / ideal))


def _dcg(ranks: np.ndarray, gains: np.ndarray, k: int) -> float | None:
    """Sum of gain / log2(rank + 1) over ranks <= k with a gain; None when there is none."""
    kept = (ranks <= k) & (gains != 0)
    if not kept.any():
        return None
    return float(np.sum(gains[kept] / np.log2(ranks[kept] + 1)))


def top_recall(measured: np.ndarray, scores: np.ndarray) -> Figure:
    """ProteinGym's `calc_toprecall`: top 10% meaning >= the 90th percentile (linear interpolation), ties in."""
    if not len(scores):
        return Figure(None, "no variant scored and measured")
    top_true = measured >= np.percentile(measured, 100 - TOP_PERCENT)
    top_model = scores >= np.percentile(scores, 100 - TOP_PERCENT)
    return Figure(float((top_true & top_model).sum() / top_true.sum()))


@dataclass(frozen=True)
class Measurements:
    """One assay's rows: the strategy's score, `DMS_score` and `DMS_score_bin` (NaN where missing; a string: why
    the assay has no such column to use) and each row's depth group (None for an unscored row)."""

    scores: np.ndarray
    measured: np.ndarray | str
    labels: np.ndarray | str
    depths: list[str | None]


def assay_figures(rows: Measurements) -> tuple[dict[str, Figure], dict[str, dict[str, Figure]]]:
    """The five figures over the assay's rows, and over each depth group's: rows with a score and the figure's
    measurement. MCC's cut is the median score of the rows it is computed on for the whole assay."""
    scored = np.isfinite(rows.scores)
    binned = scored & np.isfinite(rows.labels) if not isinstance(rows.labels, str) else scored
    cut = float(np.median(rows.scores[binned])) if binned.any() else np.nan
    everything = _figures(rows, np.ones(len(rows.scores), dtype=bool), cut)
    depths = np.asarray(rows.depths, dtype=object)
    by_depth = {}
    for depth in DEPTHS:
        of_depth = depths == depth
        if (of_depth & scored).any():
            by_depth[depth] = _figures(rows, of_depth, cut)
        else:
            by_depth[depth] = {m: Figure(None, f"no variant of depth {depth} scored") for m in METRICS}
    return everything, by_depth


def _figures(rows: Measurements, keep: np.ndarray, cut: float) -> dict[str, Figure]:
    scores = rows.scores
    out = {}
    if isinstance(rows.measured, str):
        out.update({m: Figure(None, rows.measured) for m in ("spearman", "ndcg", "top_recall")})
    else:
        ok = keep & np.isfinite(scores) & np.isfinite(rows.measured)
        x, y = rows.measured[ok], scores[ok]
        out.update(spearman=spearman(x, y), ndcg=ndcg(x, y), top_recall=top_recall(x, y))
    if isinstance(rows.labels, str):
        out.update({m: Figure(None, rows.labels) for m in ("auc", "mcc")})
    else:
        ok = keep & np.isfinite(scores) & np.isfinite(rows.labels)
        labels, y = rows.labels[ok], scores[ok]
        out["auc"] = auc(labels, y) if len(y) else Figure(None, "no variant scored with a DMS_score_bin")
        out["mcc"] = mcc(labels, (y >= cut).astype(int))
    return {m: out[m] for m in METRICS}


@dataclass(frozen=True)
class BenchmarkAssay:
    """An assay's place in ProteinGym's averages (its reference file's `UniProt_ID` and `coarse_selection_type`)
    and its figures by column: a metric, or `metric_depth` for a depth group."""

    id: str
    uniprot_id: str | None
    selection_type: str | None
    figures: dict[str, float | None]


def benchmark(assays: list[BenchmarkAssay], reshuffles: int = RESHUFFLES, seed: int = SEED) -> dict:
    """ProteinGym's averages of each metric: over selection types of the per-type mean of the per-(UniProt ID,
    type) means, its bootstrap standard error, the per-type means and, by depth, the mean over the (UniProt ID,
    type) groups (as its `Depth_` columns are). An assay without a UniProt ID or a selection type is left out, as
    pandas' groupby leaves it out."""
    placed = [a for a in assays if a.uniprot_id and a.selection_type]
    left_out = sorted(a.id for a in assays if not (a.uniprot_id and a.selection_type))
    groups = sorted({(a.uniprot_id, a.selection_type) for a in placed})
    out: dict = {"assays": len(placed), "left_out": left_out}
    if not groups:
        return {**out, "reason": "no assay has both a UniProt_ID and a coarse_selection_type in the reference file"}
    types = sorted({t for _, t in groups})
    of_type = np.asarray([t for _, t in groups], dtype=object)
    draws = _bootstrap_draws([int((of_type == t).sum()) for t in types], reshuffles, seed)
    for metric in METRICS:
        means = _group_means(placed, groups, metric)  # (groups,)
        per_type = np.asarray([_mean(means[of_type == t]) for t in types])
        average = _mean(per_type)
        error = _bootstrap_error([means[of_type == t] for t in types], draws)
        out[metric] = {
            **_value(average, "no assay has this figure"),
            "standard_error": error,
            "assays": sum(1 for a in placed if a.figures.get(metric) is not None),
            "by_selection_type": {t: _finite(v) for t, v in zip(types, per_type)},
            "by_depth": {d: _finite(_mean(_group_means(placed, groups, f"{metric}_{d}"))) for d in DEPTHS},
        }
    return out


def _group_means(assays: list[BenchmarkAssay], groups: list[tuple[str, str]], column: str) -> np.ndarray:
    """Each (UniProt ID, selection type) group's mean of the column's rounded figures, NaN where it has none."""
    rounded = {}
    for a in assays:
        value = a.figures.get(column)
        rounded.setdefault((a.uniprot_id, a.selection_type), []).append(
            np.nan if value is None else np.round(value, DECIMALS)
        )
    return np.asarray([_mean(np.asarray(rounded[g])) for g in groups])


def _bootstrap_draws(sizes: list[int], reshuffles: int, seed: int) -> list[np.ndarray]:
    """The resamples of ProteinGym's `compute_bootstrap_standard_error_functional_categories`: per type in turn
    (`sizes`: its groups), `reshuffles` draws of as many groups with replacement, each (reshuffles, size). pandas'
    `sample(frac=1, replace=True)` draws each with `randint(0, size, size)` from numpy's generator; one call of
    shape (reshuffles, size) is the same stream, so the same seed gives ProteinGym's resamples. Every metric
    is resampled with the same draws, as ProteinGym resamples the rows of one table of them."""
    rng = np.random.RandomState(seed)
    return [rng.randint(0, n, size=(reshuffles, n)) for n in sizes]


def _bootstrap_error(by_type: list[np.ndarray], draws: list[np.ndarray]) -> float | None:
    """Each resample's mean per type, the types' means averaged, their standard deviation (ddof 1)."""
    combined = np.zeros(len(draws[0]))
    for values, drawn in zip(by_type, draws):
        combined = combined + _mean(values[drawn], axis=1)
    combined = combined / len(by_type)
    kept = combined[~np.isnan(combined)]
    return float(np.std(kept, ddof=1)) if len(kept) > 1 else None


def _mean(values: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """The mean of the values that are not NaN (pandas' skipna), NaN where there is none, without a warning."""
    present = ~np.isnan(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(present, values, 0.0).sum(axis=axis) / present.sum(axis=axis)


def _finite(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def _value(value: float, reason: str) -> dict:
    return {"value": float(value)} if not np.isnan(value) else {"value": None, "reason": reason}
