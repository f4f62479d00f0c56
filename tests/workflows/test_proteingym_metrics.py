"""ProteinGym's figures (`workflows/variants/proteingym.py`) against the `proteingym` package's own code on the
same scores: per assay, per mutation depth and averaged over assays as its `main()` averages them, with its
bootstrap standard error drawn from the same seed. Its `performance_DMS_benchmarks.py` is loaded from the
installed files by path: the 1.3 wheel's `__init__` imports a `utils` module it does not ship."""

from __future__ import annotations

import csv
import json
import math
import warnings
from importlib import metadata, util
from types import ModuleType

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.io.dms import read_reference
from distributed_scoring.workflows.variants.proteingym import (
    DEPTHS,
    METRICS,
    RESHUFFLES,
    SEED,
    BenchmarkAssay,
    Measurements,
    assay_figures,
    benchmark,
    depth_group,
)

TOLERANCE = 1e-9
FEW_RESHUFFLES = 300  # the bootstrap's draws in the fast test: a run's code, in a fraction of the time
WILD = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"


@pytest.fixture(scope="module")
def theirs() -> ModuleType:
    """proteingym's performance_DMS_benchmarks.py, loaded from the installed distribution's files."""
    dist = metadata.distribution("proteingym")
    path = next(f for f in dist.files or [] if f.name == "performance_DMS_benchmarks.py")
    spec = util.spec_from_file_location("proteingym_performance", dist.locate_file(path))
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutants(rng: np.random.Generator, n: int, max_depth: int) -> list[str]:
    """n distinct names of 1 to max_depth substitutions (the names alone matter here: their depth)."""
    names = []
    for k in range(n):
        depth = int(rng.integers(1, max_depth + 1))
        names.append(":".join(f"A{k * 10 + j + 1}G" for j in range(depth)))
    return names


def assay(seed: int, n: int, kind: str = "random", max_depth: int = 6) -> pd.DataFrame:
    """A merged scoring table as ProteinGym's main() reads one: mutant, DMS_score, DMS_score_bin, the model's score.
    kind: random (continuous), ties (few distinct values on both sides), one_class, constant_scores,
    constant_measured."""
    rng = np.random.default_rng(seed)
    measured = rng.normal(size=n)
    score = 0.6 * measured + rng.normal(size=n)
    if kind == "ties":
        measured, score = np.round(measured), np.round(score * 2) / 2
    if kind == "constant_scores":
        score = np.zeros(n)
    if kind == "constant_measured":
        measured = np.full(n, 1.5)
    labels = (measured > np.median(measured)).astype(int)
    if kind == "one_class":
        labels = np.ones(n, dtype=int)
    return pd.DataFrame(
        {"mutant": mutants(rng, n, max_depth), "DMS_score": measured, "DMS_score_bin": labels, "score": score}
    )


ASSAYS = {  # name -> (table, UniProt_ID, coarse_selection_type)
    "random_big": (assay(1, 400), "P1", "Activity"),
    "random_mid": (assay(2, 120), "P1", "Activity"),
    "ties": (assay(3, 150, "ties"), "P2", "Activity"),
    "one_class": (assay(4, 60, "one_class"), "P3", "Binding"),
    "few": (assay(5, 8, max_depth=2), "P3", "Binding"),  # NDCG's top 10% holds none
    "constant_scores": (assay(6, 50, "constant_scores"), "P4", "Stability"),
    "constant_measured": (assay(7, 40, "constant_measured"), "P4", "Stability"),
    "singles": (assay(8, 90, max_depth=1), "P5", "Stability"),
    "deep": (assay(9, 300, max_depth=9), "P6", "Expression"),
    "ungrouped": (assay(10, 70), None, "Expression"),  # no UniProt_ID: left out of the averages, as pandas does
}


def their_figures(pg: ModuleType, frame: pd.DataFrame) -> dict[str, float]:
    """main()'s per-assay block for one model column `score`, with `--performance_by_depth`: the figures by name,
    `name_depth` for a depth group."""
    frame = frame.copy()
    frame["mutation_depth"] = frame["mutant"].apply(lambda x: len(x.split(":")))
    frame["mutation_depth_grouped"] = frame["mutation_depth"].apply(lambda x: "5+" if x >= 5 else str(x))
    median_cutoff = frame["score"].median()
    frame["score_bin"] = frame["score"].map(lambda x: 1 if x >= median_cutoff else 0)
    out = {}
    for suffix, rows in [("", frame)] + [(f"_{d}", frame[frame.mutation_depth_grouped == d]) for d in DEPTHS]:
        if len(rows) == 0:
            out.update({m + suffix: np.nan for m in METRICS})
            continue
        out["spearman" + suffix] = pg.spearmanr(rows["DMS_score"], rows["score"])[0]
        out["ndcg" + suffix] = pg.calc_ndcg(rows["DMS_score"], rows["score"])
        out["top_recall" + suffix] = pg.calc_toprecall(rows["DMS_score"], rows["score"])
        try:
            out["auc" + suffix] = pg.roc_auc_score(y_true=rows["DMS_score_bin"], y_score=rows["score"])
        except ValueError:
            out["auc" + suffix] = np.nan
        out["mcc" + suffix] = pg.matthews_corrcoef(y_true=rows["DMS_score_bin"], y_pred=rows["score_bin"])
    return out


def our_figures(frame: pd.DataFrame) -> dict[str, float | None]:
    """Ours, flattened as `their_figures` names them."""
    rows = Measurements(
        frame["score"].to_numpy(float),
        frame["DMS_score"].to_numpy(float),
        frame["DMS_score_bin"].to_numpy(float),
        [depth_group(m) for m in frame["mutant"]],
    )
    everything, by_depth = assay_figures(rows)
    out = {m: f.value for m, f in everything.items()}
    for depth, figures in by_depth.items():
        out.update({f"{m}_{depth}": f.value for m, f in figures.items()})
    return out


def same(ours: float | None, reference: float) -> bool:
    """Equal within TOLERANCE, our None being their NaN."""
    if ours is None or reference is None or math.isnan(reference):
        return ours is None and (reference is None or math.isnan(reference))
    return abs(ours - reference) <= TOLERANCE


@pytest.mark.filterwarnings("ignore")  # theirs warns on a constant input and divides 0 by 0 in calc_ndcg
@pytest.mark.parametrize("name", sorted(ASSAYS))
def test_every_figure_of_an_assay_and_its_depths_is_proteingyms(theirs, name):
    frame = ASSAYS[name][0]
    reference, ours = their_figures(theirs, frame), our_figures(frame)
    assert set(ours) == set(reference)
    wrong = {k: (ours[k], reference[k]) for k in reference if not same(ours[k], reference[k])}
    assert not wrong, wrong


def test_the_synthetic_assays_reach_every_case(theirs):
    """The table above holds what it says: depths 1 to 5+, NDCG of an empty top, MCC of one class, no AUC."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures = {name: their_figures(theirs, frame) for name, (frame, _, _) in ASSAYS.items()}
    assert figures["few"]["ndcg"] == 0 and math.isnan(figures["one_class"]["auc"])
    assert figures["one_class"]["mcc"] == 0 and figures["constant_scores"]["top_recall"] == 1
    assert math.isnan(figures["constant_measured"]["ndcg"]) and math.isnan(figures["singles"]["spearman_2"])
    assert all(not math.isnan(figures["deep"][f"spearman_{d}"]) for d in DEPTHS)


def their_benchmark(pg: ModuleType, per_assay: dict[str, dict[str, float]], reshuffles: int) -> dict[str, dict]:
    """main()'s averages, built as it builds them: a frame of the assays' figures (rounded to 3 decimals) with
    `UniProt_ID` and `Selection Type`, grouped by both, then by type; its bootstrap error on the (UniProt ID,
    type) means, numpy's global seed set as a run's seed. One column per figure, so that one call of its
    bootstrap resamples them all with the same draws, as a run does."""
    rows = {
        name: {**per_assay[name], "UniProt_ID": uniprot, "Selection Type": selection}
        for name, (_, uniprot, selection) in ASSAYS.items()
    }
    performance = pd.DataFrame.from_dict(rows, orient="index")
    figures = list(per_assay[next(iter(per_assay))])
    performance[figures] = performance[figures].astype(float).round(3)
    uniprot_function = performance.groupby(["UniProt_ID", "Selection Type"]).mean(numeric_only=True)
    level = uniprot_function.groupby("Selection Type").mean(numeric_only=True)
    final = level.reset_index().mean(numeric_only=True)
    np.random.seed(SEED)
    error = pg.compute_bootstrap_standard_error_functional_categories(
        uniprot_function[list(METRICS)], number_assay_reshuffle=reshuffles
    )
    return {
        metric: {
            "value": final[metric],
            "standard_error": error[metric],
            "by_selection_type": level[metric].to_dict(),
            "by_depth": {d: uniprot_function[f"{metric}_{d}"].mean() for d in DEPTHS},
        }
        for metric in METRICS
    }


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("reshuffles", [FEW_RESHUFFLES, pytest.param(RESHUFFLES, marks=pytest.mark.slow)])
def test_the_averages_and_their_bootstrap_error_are_proteingyms(theirs, reshuffles):
    """With a run's 10,000 resamples too (about 15 s of pandas' sampling: among the slow tests)."""
    per_assay = {name: their_figures(theirs, frame) for name, (frame, _, _) in ASSAYS.items()}
    reference = their_benchmark(theirs, per_assay, reshuffles)
    placed = [
        BenchmarkAssay(name, uniprot, selection, our_figures(frame))
        for name, (frame, uniprot, selection) in ASSAYS.items()
    ]
    ours = benchmark(placed, reshuffles=reshuffles)
    assert ours["assays"] == len(ASSAYS) - 1 and ours["left_out"] == ["ungrouped"]
    for metric in METRICS:
        mine, theirs_ = ours[metric], reference[metric]
        assert same(mine["value"], theirs_["value"]), (metric, mine["value"], theirs_["value"])
        assert same(mine["standard_error"], theirs_["standard_error"]), metric
        assert mine["standard_error"] > 0
        assert set(mine["by_selection_type"]) == set(theirs_["by_selection_type"])
        for kind, value in theirs_["by_selection_type"].items():
            assert same(mine["by_selection_type"][kind], value), (metric, kind)
        for depth, value in theirs_["by_depth"].items():
            assert same(mine["by_depth"][depth], value), (metric, depth)


TABLES = {  # DMS_id -> (UniProt_ID, coarse_selection_type, mutants): depths 1 to 6 in the first
    "A": ("P1", "Activity", ["M1A", "K2R", "T3S", "A4G", "Q9E", "I30V", "K2R:T3S", "A4G:Q9E", "M1L:S13T:I30F",
                             "M1A:K2R:T3S:A4G", "M1A:K2R:T3S:A4G:Q9E", "M1A:K2R:T3S:A4G:Q9E:I30V", "Y5F", "I6L"]),
    "B": ("P2", "Stability", ["M1V", "K2E", "T3A", "Y5W", "I6V", "A7G", "K8R", "Q9K", "K2E:Y5W", "T3A:I6V:A7G"]),
}  # fmt: skip


@pytest.mark.filterwarnings("ignore")
def test_dscore_variants_writes_proteingyms_figures(tmp_path, tiny_protein_dir, theirs, capsys):
    """Through the command: each assay's figures in the interface's form, equal to theirs on the run's own scores;
    with the reference's UniProt_ID and coarse_selection_type, the averages under `proteingym`; report.md shows
    them."""
    tables = tmp_path / "tables"
    tables.mkdir()
    rng = np.random.default_rng(0)
    for name, (_, _, names) in TABLES.items():
        with (tables / f"{name}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["mutant", "DMS_score", "DMS_score_bin"])
            writer.writerows([m, f"{rng.normal():.4f}", k % 2] for k, m in enumerate(names))
    reference = tmp_path / "reference.csv"
    reference.write_text(
        "DMS_id,DMS_filename,target_seq,UniProt_ID,coarse_selection_type\n"
        + "".join(f"{n},{n}.csv,{WILD},{u},{s}\n" for n, (u, s, _) in TABLES.items())
    )
    out = tmp_path / "out"
    code = main(["variants", str(tables), "--model", str(tiny_protein_dir("bert")), "--reference", str(reference),
                 "--strategy", "wt-marginal", "--output", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(capsys.readouterr().out) == summary
    frame = pd.read_parquet(out / "variants.parquet")
    for name in TABLES:
        figures = summary["by_assay"][name]
        for metric in METRICS:
            assert "value" in figures[metric] and (figures[metric]["value"] is not None or figures[metric]["reason"])
        assert set(figures["by_depth"]) == set(DEPTHS) and "interval" in figures["spearman"]
        reference_figures = their_figures(theirs, frame[frame["DMS_id"] == name].reset_index(drop=True))
        ours = {m: figures[m]["value"] for m in METRICS}
        ours.update({f"{m}_{d}": figures["by_depth"][d][m]["value"] for d in DEPTHS for m in METRICS})
        wrong = {k: (ours[k], v) for k, v in reference_figures.items() if not same(ours[k], v)}
        assert not wrong, (name, wrong)
    assert summary["by_assay"]["B"]["by_depth"]["5+"]["mcc"] == {
        "value": None,
        "reason": "no variant of depth 5+ scored",
    }
    averages = summary["proteingym"]["wt-marginal"]
    assert averages["assays"] == 2 and averages["left_out"] == []
    for metric in METRICS:
        assert set(averages[metric]["by_selection_type"]) == {"Activity", "Stability"}
        assert set(averages[metric]) >= {"value", "standard_error", "assays", "by_depth"}
    report = (out / "report.md").read_text()
    assert "ProteinGym" in report and "top 10% recall" in report
    assert len(pq.read_table(out / "variants.parquet")) == sum(len(t[2]) for t in TABLES.values())


def test_the_reference_file_gives_each_assay_its_protein_and_selection_type(tmp_path):
    """Read where the file has the columns (an empty cell: none, so the assay is left out of the averages), None
    where it has not."""
    with_columns = tmp_path / "with.csv"
    with_columns.write_text(
        "DMS_id,DMS_filename,target_seq,UniProt_ID,coarse_selection_type\nA,A.csv,MK,P1,Activity\nB,B.csv,MK,,Binding\n"
    )
    without = tmp_path / "without.csv"
    without.write_text("DMS_id,DMS_filename,target_seq\nA,A.csv,MK\n")
    placed = [(a.id, a.uniprot_id, a.selection_type) for a in read_reference(str(with_columns), str(tmp_path))]
    assert placed == [("A", "P1", "Activity"), ("B", None, "Binding")]
    assert [(a.uniprot_id, a.selection_type) for a in read_reference(str(without), str(tmp_path))] == [(None, None)]
    assert benchmark([BenchmarkAssay("A", None, None, {})])["reason"].startswith("no assay has both")
