"""Junk lines in a night of real chains (issue 51): rows made of the tokenizer's unknown token are listed apart,
every one of them, whatever the partition's spread; the worst-rows lists show the highest rows flagged or not,
each labelled; the headline's outlier count is the rows the report labels outliers; with a baseline, a
partition's cutoff is the baseline's, so a contaminated night cannot widen its own rule.

The night: 30 human and 30 mouse germline chain starts (45 residues), half the human ones shuffled in place,
and six junk lines added to the human file. Sapiens VH reads none of the junk's characters but a residue's
letters: the junk rows are all unknown tokens and score 4.4-6.7 nats per token, above the shuffled chains.
"""

from __future__ import annotations

import html
import json
import random
import re

import pytest

from distributed_scoring.cli import main

import helpers.series as series
from helpers.audit import corrupt
from helpers.series import audit_json, chains, write_night

RESIDUES = 45
JUNK = [
    "lorem ipsum dolor sit amet consectetur adipiscing elit",
    "<html><body>404 Not Found</body></html>",
    "asdf asdf asdf qwer",
    "####",
    "NULL",
    "1234567890",
]


@pytest.fixture(scope="module")
def nights(offline_model_dir, tmp_path_factory):
    """(model, clean night's files, degraded night's files, the shuffled human chains)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(series, "RESIDUES", RESIDUES)
        human, mouse = chains("human")[:30], chains("mouse")[:30]
    rng = random.Random(51)
    degraded = [corrupt(c, rng, "shuffle") if i % 2 else c for i, c in enumerate(human)]
    root = tmp_path_factory.mktemp("junk")
    clean = write_night(root / "clean", {"human": human, "mouse": mouse})
    night = write_night(root / "degraded", {"human": degraded + JUNK, "mouse": mouse})
    shuffled = {f"human.txt:{i + 1}" for i in range(1, len(human), 2)}  # ids are the file and the 1-based line
    return str(offline_model_dir("sapiens-vh")), clean, night, shuffled


def _audit(paths: list[str], model: str, out, capsys, *extra: str) -> tuple[dict, dict, str]:
    """Audit a night; its printed headline, audit.json and report.html."""
    rc = main(["audit", *paths, "--model", model, "--output", str(out), *extra])
    headline = json.loads(capsys.readouterr().out)
    assert rc == headline["exit_code"]
    return headline, audit_json(out), (out / "report.html").read_text()


def _section(page: str, title: str) -> str:
    start = page.index(f">{title}</h")
    following = re.search(r"<h[1-3][ >]", page[start + 1 :])
    return page[start : start + 1 + following.start()] if following else page[start:]


def _labelled_outliers(page: str) -> int:
    """Rows the report's worst-rows lists label as counted outliers."""
    return sum(
        _section(page, title).count("<td>outlier</td>") for title in ("Worst rows overall", "Worst rows per partition")
    )


def _check_junk_listed(audit: dict, page: str) -> None:
    unknown = audit["unknown_tokens"]
    assert unknown["count"] == len(JUNK) and unknown["by_partition"] == {"human.txt": len(JUNK)}
    assert sorted(row["text"] for row in unknown["listed"]) == sorted(JUNK)
    assert all(row["unknown_share"] == 1.0 and row["nll_per_token"] > 4 for row in unknown["listed"])
    shown = _section(page, "Rows mostly of unknown tokens")
    assert all(html.escape(line, quote=True) in shown for line in JUNK)
    judged = [row["id"] for scope in audit["outliers"]["worst"].values() for row in scope["listed"]]
    assert not {row["id"] for row in unknown["listed"]} & set(judged)  # apart: not judged by the outlier rule


@pytest.mark.weights
def test_junk_is_listed_and_the_headline_counts_what_the_report_lists(nights, tmp_path, capsys):
    model, _, night, shuffled = nights
    headline, audit, page = _audit(night, model, tmp_path / "night", capsys)
    _check_junk_listed(audit, page)
    outliers = audit["outliers"]
    assert headline["outliers"] == outliers["count"] == _labelled_outliers(page)
    assert f"<b>{headline['outliers']}</b><span>outliers" in page
    assert "<b>6</b><span>rows mostly unknown tokens" in page
    assert outliers["eligible"] == 60  # the chains: the junk is in no cutoff's median or spread
    # The highest rows are listed whether a cutoff flags them or not, each labelled.
    per_partition = outliers["worst"]["partition"]["listed"]
    assert len(per_partition) == audit["config"]["listed"] or len(per_partition) == outliers["eligible"]
    worst_human = [row["id"] for row in outliers["worst"]["overall"]["listed"][: len(shuffled)]]
    assert set(worst_human) == shuffled  # the shuffled chains lead the corpus-wide list
    labels = ("<td>outlier</td>", "<td>not flagged</td>", "<td>beyond this rule, not counted</td>")
    shown = _section(page, "Worst rows overall")
    assert sum(shown.count(label) for label in labels) == len(outliers["worst"]["overall"]["listed"])


@pytest.mark.weights
def test_with_a_baseline_the_cutoffs_are_the_baselines(nights, tmp_path, capsys):
    model, clean, night, shuffled = nights
    _audit(clean, model, tmp_path / "clean", capsys)
    headline, audit, page = _audit(night, model, tmp_path / "night", capsys, "--baseline", str(tmp_path / "clean"))
    _check_junk_listed(audit, page)
    outliers = audit["outliers"]
    base = audit_json(tmp_path / "clean")["outliers"]["cutoffs"]["human.txt"]
    human = outliers["cutoffs"]["human.txt"]
    assert human["source"] == "baseline" and human["median"] == base["median"]
    flagged = {row["id"] for row in outliers["listed"]}
    assert shuffled <= flagged, shuffled - flagged  # the contaminated night's own spread would hide them
    assert headline["outliers"] == outliers["count"] == len(flagged) == _labelled_outliers(page)
    print({"outliers": headline["outliers"], "human cutoff": human, "flagged": sorted(flagged)})
