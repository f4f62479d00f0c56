"""report.html: verdict first, charts embedded as PNG, tables escaped, and it renders in a real browser."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from distributed_scoring.io import schema as S
from distributed_scoring.workflows.audit.baseline_io import load_baseline
from distributed_scoring.workflows.audit.charts import lengths_title
from distributed_scoring.workflows.audit.figures import AuditConfig, run_audit
from distributed_scoring.workflows.audit.outliers import OutlierRule
from distributed_scoring.workflows.audit.report import render_report
from distributed_scoring.workflows.audit.verdicts import INSUFFICIENT, NO_CHANGE, REGRESSION, Thresholds

from helpers.audit import scored_table, write_rows
from helpers.browser import chromium

HOSTILE = "<script>alert('x')</script> & \"quotes\""
CONFIG = AuditConfig(thresholds=Thresholds(min_rows=50), listed=10)


class Page(HTMLParser):
    """What a page holds: its images, tables, table rows, verdict classes and body attributes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images, self.tables, self.rows, self.verdicts, self.scripts, self.body = [], 0, 0, [], 0, {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        self.tables += tag == "table"
        self.rows += tag == "tr"
        self.scripts += tag == "script"
        if tag == "div" and "verdict" in attrs.get("class", ""):
            self.verdicts.append(attrs["class"])
        if tag == "body":
            self.body = attrs


@pytest.fixture(scope="module")
def audits(tmp_path_factory):
    """A baseline audit and a regressed one whose partition names and garbage text are hostile HTML."""
    root = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(7)
    base = pa.concat_tables(
        [
            scored_table(rng, 600, "news", nll=2.0, lengths=(8, 40)),
            scored_table(rng, 400, HOSTILE, nll=2.4, lengths=(8, 40), error_rate=0.02),
        ]
    )
    garbage = scored_table(rng, 12, "news", nll=6.0, lengths=(8, 40), prefix="garbage-")
    garbage = garbage.set_column(garbage.schema.get_field_index(S.TEXT), S.TEXT, pa.array([HOSTILE] * 12))
    now = pa.concat_tables(
        [
            scored_table(rng, 600, "news", nll=2.0, lengths=(8, 40)),
            scored_table(rng, 400, HOSTILE, nll=3.0, lengths=(8, 40), error_rate=0.02),
            garbage,
        ]
    )
    write_rows(root / "base", base, files=2)
    write_rows(root / "now", now, files=2)
    first = run_audit(str(root / "base"), str(root / "a-base"), config=CONFIG)
    second = run_audit(str(root / "now"), str(root / "a-now"), baseline=first.audit_path, config=CONFIG)
    return first, second


def test_report_shows_verdict_charts_and_escaped_tables(audits):
    _, result = audits
    text = Path(result.report_path).read_text()
    page = Page(text)
    assert page.verdicts == ["verdict regression"] and "exit 3" in text
    assert len(page.images) == 4  # ratios with intervals, partitions, histogram, positionwise
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert page.tables == 4  # verdicts per scope, partition figures, worst rows overall and per partition
    assert page.rows >= (1 + 3) + (1 + 3) + (1 + 10) + (1 + 10)
    assert "Changes against the baseline" in text and "interval" in text
    verdicts = result.audit["baseline"]["partitions"]
    assert verdicts[HOSTILE]["status"] == "regression" and verdicts["news"]["status"] != "regression"
    assert page.scripts == 0 and "<script>alert" not in text
    assert html.escape(HOSTILE, quote=True) in text
    assert "garbage-news:" in section(text, "Worst rows overall")  # the garbage rows are the worst
    assert "http://" not in text and "https://" not in text  # nothing to fetch: it opens offline


def section(text: str, title: str) -> str:
    """The part of a report under the heading `title`, up to the next heading; the heading must be there once."""
    assert text.count(f">{title}</h") == 1, title
    start = text.index(f">{title}</h")
    following = re.search(r"<h[1-3][ >]", text[start:])
    return text[start : start + following.start()] if following else text[start:]


@pytest.mark.parametrize("scope", ["partition", "overall"])
def test_the_worst_rows_are_listed_overall_and_per_partition_whatever_the_scope(tmp_path, scope):
    """80 junk strings in a file of their own: one outlier rule per partition measured the junk against the
    junk, and the report's worst sentences used to be 10 human fragments. Both lists are shown,
    labelled, whatever `--outlier-scope`: the junk is the worst overall, the fragments the worst within a
    partition; audit.json records both."""
    rng = np.random.default_rng(11)
    table = pa.concat_tables(
        [
            scored_table(rng, 400, "human", nll=1.5, spread=0.1, lengths=(60, 100)),
            scored_table(rng, 200, "mouse", nll=1.7, spread=0.1, lengths=(60, 100)),
            scored_table(rng, 5, "human", nll=3.0, spread=0.05, lengths=(60, 100), prefix="fragment-"),
            scored_table(rng, 80, "junk.txt", nll=6.0, spread=0.3, lengths=(60, 100), prefix="junk-"),
        ]
    )
    write_rows(tmp_path / "run", table, files=3)
    config = replace(CONFIG, outliers=OutlierRule(scope=scope))
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=config)
    fragments = {f"fragment-human:{i}" for i in range(5)}

    worst = json.loads(Path(result.audit_path).read_text())["outliers"]["worst"]
    overall, per_partition = worst["overall"], worst["partition"]
    assert overall["count"] >= 80 and len(overall["listed"]) == CONFIG.listed
    assert all(row["id"].startswith("junk-") and row["partition"] == "junk.txt" for row in overall["listed"])
    assert fragments <= {row["id"] for row in per_partition["listed"]}
    assert all(row["flagged"] == (row["robust_z"] > 3.5) for row in overall["listed"] + per_partition["listed"])
    assert all(row["robust_z"] > 3.5 and row["tail"] == "high" for row in overall["listed"])
    assert all(row["flagged"] for row in per_partition["listed"] if row["id"] in fragments)
    chosen = result.audit["outliers"]
    flagged = [row for row in worst[scope]["listed"] if row["flagged"]]  # the highest rows, flagged ones first
    assert chosen["listed"] == flagged and chosen["count"] == worst[scope]["count"]

    text = Path(result.report_path).read_text()
    shown_overall = section(text, "Worst rows overall")
    shown_per_partition = section(text, "Worst rows per partition")
    assert shown_overall.count("junk-junk.txt:") == CONFIG.listed and "fragment-" not in shown_overall
    assert all(i in shown_per_partition for i in fragments)
    if scope == "partition":  # the rows the chosen rule does not count say which flag would count them
        assert "--outlier-scope overall" in shown_overall


def test_the_methods_name_each_figure_and_method_once(audits):
    """The methods used to read "Methods: error rate: ...; error rate: ...; paired percentile bootstrap ...; ...",
    naming each pairing as a method of its own and the PPPL's method without its figure. Now one entry per figure and
    method, with the scopes it was used in, in audit.json and once in the report."""
    _, result = audits
    methods = json.loads(Path(result.audit_path).read_text())["baseline"]["methods"]
    assert methods == [  # the hostile partition's ids are the baseline's (paired); the news partition gained rows
        "pppl_token ratio: percentile bootstrap over rows, 2000 resamples (paired in 1 scope, unpaired in 2)",
        "error rate change: Newcombe hybrid score interval (unpaired in 2 scopes)",
        "error rate change: percentile bootstrap over rows, 2000 resamples (paired in 1 scope)",
    ]
    text = html.unescape(Path(result.report_path).read_text())
    assert text.count("Methods: ") == 1 and f"Methods: {'; '.join(methods)}. Seed" in text


def test_the_regression_banner_lists_only_the_regressed_scopes(audits):
    """The red banner used to list also a scope whose verdict was "insufficient data". It is listed apart,
    in a neutral box, and the banner counts only the regressions."""
    _, result = audits
    comparison = result.comparison
    news = next(c for c in comparison.partitions if c.name == "news")
    undecided = replace(news, status=INSUFFICIENT, reasons=("pppl_token ratio 1.02 crosses the edge",))
    partitions = tuple(undecided if c.name == "news" else c for c in comparison.partitions)
    record = replace(result.record, baseline=replace(comparison, partitions=partitions))
    regressed = [c.name for c in record.baseline.regressions]
    assert "news" not in regressed and HOSTILE in regressed and record.baseline.insufficient == (undecided,)

    text = render_report(record)
    banner = text[text.index("<div class='verdict") :]
    banner = banner[: banner.index("</div>")]
    assert f"REGRESSION in {len(regressed)} place(s)" in banner
    assert f"<b>{html.escape(HOSTILE, quote=True)}</b> ({REGRESSION})" in banner
    assert "<b>news</b>" not in banner and INSUFFICIENT not in banner
    aside = text[text.index("<div class='aside'>") :]
    aside = aside[: aside.index("</div>")]
    assert f"<b>news</b> ({INSUFFICIENT}): pppl_token ratio 1.02 crosses the edge" in aside
    assert Page(text).verdicts == ["verdict regression"]  # the aside is no second banner


def test_report_without_baseline_or_per_token_columns(tmp_path):
    rng = np.random.default_rng(8)
    table = scored_table(rng, 300, "only", nll=2.0).drop_columns([S.TOKENS, S.TOKEN_LOGPROBS])
    write_rows(tmp_path / "run", table, files=1)
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=CONFIG)
    text = Path(result.report_path).read_text()
    page = Page(text)
    assert page.verdicts == ["verdict none"] and "No baseline" in text
    assert len(page.images) == 2 and "--per-token" in text


def test_math_in_partition_names_and_short_corpora_render(tmp_path):
    """Partition names are data, not mathtext; a curve with nothing to draw says why; few rows say
    "insufficient data" in the banner."""
    rng = np.random.default_rng(9)
    names = ["$x^2$ \\frac", "cost: $5 and $6"]
    small = pa.concat_tables([scored_table(rng, 6, name, lengths=(2, 4)) for name in names])
    write_rows(tmp_path / "base", small, files=1)
    first = run_audit(str(tmp_path / "base"), str(tmp_path / "a1"), config=CONFIG)
    second = run_audit(str(tmp_path / "base"), str(tmp_path / "a2"), baseline=first.audit_path, config=CONFIG)
    text = Path(second.report_path).read_text()
    assert Page(text).verdicts == ["verdict insufficient-data"] and "INSUFFICIENT DATA" in text and "exit 5" in text
    assert all(html.escape(name, quote=True) in text for name in names)


def test_report_is_a_pure_function_of_the_audit(audits):
    first, second = audits
    assert render_report(second.record) != render_report(first.record)
    assert "PASS" not in render_report(first.record)  # no baseline, so no pass either
    comparison = second.comparison
    calm = [replace(c, status=NO_CHANGE) for c in (comparison.overall, *comparison.partitions)]
    same = replace(second.record, baseline=replace(comparison, overall=calm[0], partitions=tuple(calm[1:])))
    assert "PASS" in render_report(same)


def test_an_audit_json_written_before_typed_records_is_a_baseline_and_renders(tmp_path):
    """tests/data/audit_v2 holds an audit.json (with a regression against its own baseline) and its
    row_stats.parquet, written by the code before audit.json was built from typed records."""
    v2 = Path(__file__).resolve().parents[2] / "data" / "audit_v2"
    record, uri = load_baseline(str(v2))
    assert record.version == 2 and uri == str(v2 / "audit.json")
    assert record.to_json() == json.loads((v2 / "audit.json").read_text())  # read back exactly as written
    assert record.baseline.verdict == "regression" and record.baseline.new_partitions == ("forum",)
    page = render_report(record)
    assert Page(page).verdicts == ["verdict regression"] and "forum" in page
    assert record.outliers.worst is None and record.outliers.rule.scope == "partition"  # only its scope's rows
    assert "Not recorded" in section(page, "Worst rows overall")
    assert "the outliers counted above" in section(page, "Worst rows per partition")
    rng = np.random.default_rng(3)
    now = pa.concat_tables(
        [
            scored_table(rng, 120, "news", nll=2.0, lengths=(4, 12)),
            scored_table(rng, 60, "web", nll=3.2, lengths=(4, 12)),
        ]
    )
    write_rows(tmp_path / "now", now, files=1)
    result = run_audit(str(tmp_path / "now"), str(tmp_path / "audit"), baseline=str(v2), config=CONFIG)
    assert result.comparison.vanished_partitions == ("forum",)
    assert result.comparison.overall.paired is False and result.comparison.overall.pppl_ratio is not None
    assert "PPPL audit" in (tmp_path / "audit" / "report.html").read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(audits, tmp_path):
    _, result = audits
    probe = tmp_path / "probe.html"  # the report plus a script that records which images the browser decoded
    probe.write_text(
        Path(result.report_path)
        .read_text()
        .replace(
            "</body>",
            "<script>window.addEventListener('load', () => document.body.setAttribute('data-decoded', "
            "[...document.images].filter(i => i.complete && i.naturalWidth > 300).length));</script></body>",
        )
    )
    dom = Page(chromium("--dump-dom", "--virtual-time-budget=5000", probe.as_uri()))
    assert dom.body.get("data-decoded") == "4"
    assert len(dom.images) == 4 and dom.tables == 4 and dom.verdicts == ["verdict regression"]

    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2400", Path(result.report_path).as_uri())
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280) and pixels.std() > 0.1  # not a blank page


@pytest.mark.parametrize(
    "shown, lengths, title",
    [
        (0, 0, "by sentence length"),
        (1, 1, "by sentence length (its only length)"),
        (3, 3, "by sentence length (all 3 lengths)"),
        (4, 1200, "by sentence length (the 4 most frequent of 1,200 lengths)"),
    ],
)
def test_the_length_panels_title_reads_for_any_count(shown, lengths, title):
    assert lengths_title(shown, lengths) == title
