"""The audit's history (`--history`): nights appended exactly once, judged against the nights before them,
read back by pandas and `dscore history`, charted in trend.html, exported as OpenMetrics; on local disk and
S3 (moto). Scored rows are synthetic (`helpers.audit.scored_table`): the statistics are what is tested here;
test_series_simulation.py runs real chains through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families

from distributed_scoring.cli import main
from distributed_scoring.workflows.audit.figures import AuditConfig, run_audit
from distributed_scoring.workflows.audit.history import History, night_key
from distributed_scoring.workflows.audit.metrics import openmetrics
from distributed_scoring.workflows.audit.nightly import SeriesInputs, combined_exit
from distributed_scoring.workflows.audit.series import SeriesRules, theil_sen
from distributed_scoring.workflows.audit.verdicts import Thresholds

from helpers.audit import scored_table, write_rows
from helpers.browser import chromium

CONFIG = AuditConfig(thresholds=Thresholds(min_rows=50))
ROWS = 4000  # a night per partition: enough rows that quiet nights show no change (drift included)


def night_rows(folder: Path, seed: int, news: float = 2.0, web: float = 2.6, web_rows: int = ROWS) -> Path:
    rng = np.random.default_rng(seed)
    parts = [scored_table(rng, ROWS, "news", nll=news, lengths=(20, 40))]
    if web_rows:
        parts.append(scored_table(rng, web_rows, "web", nll=web, lengths=(20, 40)))
    return write_rows(folder, pa.concat_tables(parts), files=2)


def audit_night(tmp_path: Path, hist: str, k: int, **levels) -> object:
    rows = night_rows(tmp_path / f"snap{k}", seed=k, **levels)
    series = SeriesInputs(hist, f"n{k}", SeriesRules())
    return run_audit(str(rows), str(tmp_path / f"audit{k}"), config=CONFIG, series=series)


def test_nights_are_judged_against_their_history_and_kept_once(tmp_path):
    hist = str(tmp_path / "hist")
    results = [audit_night(tmp_path, hist, k) for k in range(1, 9)]
    # Rolling judges from 3 nights on, drift from 5 points: until then the series cannot tell, and says so.
    assert [r.record.series.verdict for r in results[:4]] == ["insufficient history"] * 4
    assert all(r.exit_code == 0 and not r.record.series.regressions for r in results)
    assert results[-1].record.series.verdict == "pass", results[-1].record.series.to_json()
    spike = audit_night(tmp_path, hist, 9, web=3.2)  # web's PPPL x1.8 for one night
    assert spike.exit_code == 3 and "rolling" in spike.record.series.scopes[-1].flagged
    after = audit_night(tmp_path, hist, 10)  # the spike does not poison the reference
    assert after.exit_code == 0 and not after.record.series.regressions
    again = audit_night(tmp_path, hist, 10)  # a rerun of a night replaces it
    assert again.exit_code == 0
    table = pq.read_table(hist).to_pandas()
    assert sorted(set(table["night"]), key=night_key) == [f"n{k}" for k in range(1, 11)]
    assert table.groupby(["night", "scope"]).size().max() == 1 and len(table) == 10 * 3
    saved = json.loads((tmp_path / "audit9" / "audit.json").read_text())["series"]
    assert "rolling" in saved["flagged"]["web"] and "news" not in saved["flagged"] and saved["exit_code"] == 3


def test_a_vanished_partition_and_its_return_are_events(tmp_path):
    hist = str(tmp_path / "hist")
    for k in range(1, 4):
        audit_night(tmp_path, hist, k)
    gone = audit_night(tmp_path, hist, 4, web_rows=0)
    assert gone.record.series.events == ({"night": "n4", "scope": "web", "event": "vanished"},)
    back = audit_night(tmp_path, hist, 5)
    assert back.record.series.events == ({"night": "n5", "scope": "web", "event": "returned"},)
    vanished = pq.read_table(hist, filters=[("night", "=", "n4"), ("scope", "=", "web")]).to_pylist()
    assert vanished[0]["event"] == "vanished" and vanished[0]["rows"] == 0


def test_theil_sen_ignores_one_outlier_and_bounds_a_clean_line():
    y = np.log1p(0.015) * np.arange(8)
    slope, low, high = theil_sen(y, 0.95)
    assert slope == pytest.approx(np.log1p(0.015)) and low == pytest.approx(slope) and high == pytest.approx(slope)
    y[3] += 1.0
    assert theil_sen(y, 0.95)[0] == pytest.approx(np.log1p(0.015))


def test_exit_codes_combine_a_regression_first_then_a_scorer_change():
    class Series:
        def __init__(self, code):
            self.exit_code = code

    assert combined_exit(0, Series(3)) == 3 and combined_exit(3, Series(4)) == 3
    assert combined_exit(5, Series(4)) == 4 and combined_exit(5, Series(0)) == 5 and combined_exit(4, None) == 4


def test_history_command_table_backfill_and_trend_page(tmp_path, capsys):
    folders = []
    for k in range(1, 5):  # earlier audits, without a history
        rows = night_rows(tmp_path / f"snap{k}", seed=k)
        result = run_audit(str(rows), str(tmp_path / f"a{k}"), config=CONFIG)
        data = json.loads(Path(result.audit_path).read_text())
        data["created"] = f"2026-11-0{k}T03:00:00+00:00"  # as if audited on four nights
        Path(result.audit_path).write_text(json.dumps(data))
        folders.append(str(tmp_path / f"a{k}"))
    hist = tmp_path / "hist"
    trend = tmp_path / "trend.html"
    assert main(["history", str(hist), "--add", *folders, "--trend", str(trend)]) == 0
    out = capsys.readouterr().out
    assert "added 2026-11-01" in out and "2026-11-04" in out and trend.exists()
    assert History(str(hist)).nights() == ["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04"]
    page = trend.read_text()
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert main(["history", str(tmp_path / "none")]) == 2  # no history there: one line, exit 2
    assert "holds no night" in capsys.readouterr().err


def test_the_metrics_file_parses_as_openmetrics_and_prometheus_text(tmp_path):
    hist = str(tmp_path / "hist")
    for k in range(1, 5):
        result = audit_night(tmp_path, hist, k)
    text = openmetrics(result.record, result.exit_code)
    families = {f.name: f for f in openmetrics_families(text)}
    assert {"dscore_audit_pppl_token", "dscore_audit_flagged", "dscore_audit_exit_code"} <= set(families)
    pppl = {s.labels["scope"]: s.value for s in families["dscore_audit_pppl_token"].samples}
    assert pppl["(overall)"] == pytest.approx(result.record.overall.pppl_token)
    rules = {(s.labels["scope"], s.labels["rule"]) for s in families["dscore_audit_flagged"].samples}
    assert ("web", "drift") in rules
    assert {f.name for f in prometheus_families(text)} >= {"dscore_audit_rows"}  # the textfile collector's format


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)")
def test_trend_page_renders_in_headless_chromium(tmp_path):
    hist = str(tmp_path / "hist")
    for k in range(1, 7):
        audit_night(tmp_path, hist, k, web=3.2 if k == 6 else 2.6)
    trend = tmp_path / "trend.html"
    assert main(["history", hist, "--trend", str(trend)]) == 0
    dom = chromium("--dump-dom", "--virtual-time-budget=3000", trend.as_uri())
    assert dom.count("<svg") == 9 and "flagged: n6" in dom  # 3 scopes x 3 charts; the spike marked
    shot = tmp_path / "trend.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,1600", trend.as_uri())
    from matplotlib.image import imread

    assert imread(shot).std() > 0.05


SCRIPT = """
import sys, time
from pathlib import Path
from distributed_scoring.io.output import OutputDir
from distributed_scoring.workflows.audit.figures import AuditConfig, run_audit
from distributed_scoring.workflows.audit.nightly import SeriesInputs
from distributed_scoring.workflows.audit.verdicts import Thresholds
rows, out, hist, night, pause = sys.argv[1:6]
if pause == "pause":  # killed in the middle of the history's write: the lock held, half a temporary file
    original = OutputDir.write_bytes
    def write_bytes(self, name, data):
        if name.endswith(".parquet") and "hist" in self.uri:
            Path(self.path("." + name + ".tmp")).write_bytes(bytes(data)[: len(data) // 2])
            Path(out + ".paused").write_text("")
            time.sleep(600)
        return original(self, name, data)
    OutputDir.write_bytes = write_bytes
series = SeriesInputs(hist, night)
run_audit(rows, out, config=AuditConfig(thresholds=Thresholds(min_rows=50)), series=series)
"""


def _audit_process(tmp_path: Path, rows: Path, out: str, hist: str, night: str, pause: bool = False):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(rows), out, hist, night, "pause" if pause else "-"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_kill_during_the_append_then_rerun_leaves_one_row_per_scope(tmp_path):
    hist = str(tmp_path / "hist")
    rows = night_rows(tmp_path / "snap", seed=1)
    out = str(tmp_path / "audit")
    killed = _audit_process(tmp_path, rows, out, hist, "n1", pause=True)
    deadline = time.monotonic() + 120
    while not Path(out + ".paused").exists():
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (tmp_path / "hist" / "_lock.json").exists() and History(hist).nights() == []
    rerun = _audit_process(tmp_path, rows, out, hist, "n1")
    assert rerun.wait(timeout=300) == 0, rerun.communicate()
    table = pq.read_table(hist)
    assert table.num_rows == 3 and set(table["night"].to_pylist()) == {"n1"}
    assert not (tmp_path / "hist" / "_lock.json").exists()


def _two_nights_at_once(tmp_path: Path, hist: str) -> None:
    rows = [night_rows(tmp_path / f"snap{k}", seed=k) for k in (1, 2)]
    procs = [_audit_process(tmp_path, rows[k - 1], str(tmp_path / f"audit{k}"), hist, f"n{k}") for k in (1, 2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.communicate()


def test_two_audits_of_different_nights_at_once_both_land_once(tmp_path):
    hist = str(tmp_path / "hist")
    _two_nights_at_once(tmp_path, hist)
    table = pq.read_table(hist).to_pandas()
    assert sorted(set(table["night"])) == ["n1", "n2"] and table.groupby(["night", "scope"]).size().max() == 1


def test_a_history_on_s3_is_appended_once_per_night(tmp_path, s3):
    hist = f"s3://{s3.name}/history"
    _two_nights_at_once(tmp_path, hist)
    audit_night(tmp_path, hist, 2)  # a rerun of n2 replaces it
    history = History(hist)
    assert history.nights() == ["n1", "n2"]
    assert all(history.read(night).num_rows == 3 for night in history.nights())


def test_a_bad_night_label_or_a_canary_without_history_is_refused_before_work(tmp_path, capsys):
    common = [str(tmp_path / "missing.txt"), "--model", "x", "--output", str(tmp_path / "out")]
    (tmp_path / "missing.txt").write_text("a b c\n")
    assert main(["audit", *common, "--history", str(tmp_path / "h"), "--night", "../x"]) == 2
    assert "night '../x'" in capsys.readouterr().err
    assert main(["audit", *common, "--canary", str(tmp_path / "missing.txt")]) == 2
    assert "--history" in capsys.readouterr().err
