"""Outlier cutoffs from the series' reference nights (`--history` without `--baseline`): a night with half a
partition garbled cannot widen its own rule. Scored rows are synthetic (`helpers.audit.scored_table`), so a
series of nights takes seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.io import schema as S
from distributed_scoring.workflows.audit.figures import AuditConfig, AuditResult, run_audit
from distributed_scoring.workflows.audit.nightly import SeriesInputs
from distributed_scoring.workflows.audit.outliers import BASELINE, OUTLIERS_FILE, SERIES, OutlierRule
from distributed_scoring.workflows.audit.series import SeriesRules
from distributed_scoring.workflows.audit.verdicts import OVERALL

from helpers.audit import scored_table, write_rows

ROWS = 400  # per partition and night
CLEAN = 4  # clean nights before the contaminated one
GARBLED = "garbled-"  # the id prefix of tonight's garbled web rows


def night_rows(tmp_path: Path, k: int, garbled: int = 0) -> Path:
    """Night `k`'s rows: news and web at their usual levels, plus `garbled` web rows far harder (shuffled text
    reads about 3.4 nats per token above web's 2.6)."""
    rng = np.random.default_rng(k)
    parts = [
        scored_table(rng, ROWS, "news", nll=2.0, lengths=(20, 40)),
        scored_table(rng, ROWS, "web", nll=2.6, lengths=(20, 40)),
    ]
    if garbled:
        parts.append(scored_table(rng, garbled, "web", nll=6.0, lengths=(20, 40), prefix=GARBLED))
    return write_rows(tmp_path / f"snap{k}", pa.concat_tables(parts), files=2, seed=k)


def audit(tmp_path: Path, rows: Path, name: str, hist: str | None, baseline: str | None = None) -> AuditResult:
    series = SeriesInputs(hist, name, SeriesRules()) if hist else None
    return run_audit(str(rows), str(tmp_path / name), baseline, AuditConfig(), series=series)


def garbled_flagged(result: AuditResult) -> tuple[int, int]:
    """How many garbled and how many clean rows the audit flagged (outliers.parquet holds every flagged row)."""
    ids = pq.read_table(Path(result.output_dir) / OUTLIERS_FILE, columns=[S.ID])[S.ID].to_pylist()
    garbled = sum(i.startswith(GARBLED) for i in ids)
    return garbled, len(ids) - garbled


@pytest.fixture
def history(tmp_path: Path) -> str:
    """A history of `CLEAN` clean nights, n1 to n4."""
    hist = str(tmp_path / "hist")
    for k in range(1, CLEAN + 1):
        audit(tmp_path, night_rows(tmp_path, k), f"n{k}", hist)
    return hist


def test_a_contaminated_night_is_judged_by_the_reference_nights_cutoffs(tmp_path, history):
    rows = night_rows(tmp_path, CLEAN + 1, garbled=ROWS)  # half of web garbled: its own MAD widens
    alone = audit(tmp_path, rows, "alone", None)
    judged = audit(tmp_path, rows, f"n{CLEAN + 1}", history)

    own = alone.record.outliers.cutoffs["web"]
    assert own.source is None and own.sigma > 1.0  # tonight's own rule, widened by the garbled half
    assert garbled_flagged(alone)[0] < ROWS // 20  # under it, nearly every garbled row passes

    cutoff = judged.record.outliers.cutoffs["web"]
    assert cutoff.source == SERIES and cutoff.nights == [f"n{k}" for k in range(1, CLEAN + 1)]
    assert cutoff.median == pytest.approx(2.6, abs=0.1) and cutoff.sigma < 0.7  # the clean nights' rule
    garbled, clean = garbled_flagged(judged)
    assert garbled > 0.9 * ROWS and clean < 0.01 * 2 * ROWS  # of 800 clean rows (news and web)
    assert judged.audit["outliers"]["cutoffs"]["web"]["source"] == SERIES
    html = (Path(judged.output_dir) / "report.html").read_text()
    assert f"the series&#x27;: median of {CLEAN} reference nights, n1 to n{CLEAN}" in html

    # The history keeps tonight's own (widened) figures, and the median over nights does not follow them.
    kept = pq.read_table(Path(history) / f"n{CLEAN + 1}.parquet").to_pylist()
    web = next(r for r in kept if r["scope"] == "web")
    assert web["outlier_sigma"] == pytest.approx(own.measured_sigma)
    after = audit(tmp_path, night_rows(tmp_path, CLEAN + 2), f"n{CLEAN + 2}", history)
    assert after.record.outliers.cutoffs["web"].sigma == pytest.approx(cutoff.sigma, rel=0.1)


def test_the_baseline_keeps_precedence_and_old_nights_give_no_cutoff(tmp_path, history):
    rows = night_rows(tmp_path, CLEAN + 1, garbled=ROWS)
    with_baseline = audit(tmp_path, rows, f"n{CLEAN + 1}", history, baseline=str(tmp_path / "n1"))
    cutoffs = with_baseline.record.outliers.cutoffs
    assert {c.source for c in cutoffs.values()} == {BASELINE}  # the partition scope: the baseline has them all

    for path in Path(history).glob("*.parquet"):  # nights written before the history kept the two figures
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["outlier_median", "outlier_sigma"]), path)
    unreferenced = audit(tmp_path, rows, "again", history)
    assert all(c.source is None for c in unreferenced.record.outliers.cutoffs.values())
    assert unreferenced.record.overall.outlier_median is not None  # tonight's own, kept for the nights after


def test_both_scopes_take_the_series_cutoff(tmp_path, history):
    rows = night_rows(tmp_path, CLEAN + 1, garbled=ROWS)
    result = run_audit(
        str(rows),
        str(tmp_path / "overall"),
        config=AuditConfig(outliers=OutlierRule(scope="overall")),
        series=SeriesInputs(history, f"n{CLEAN + 1}", SeriesRules()),
    )
    assert result.record.outliers.cutoffs[OVERALL].source == SERIES
