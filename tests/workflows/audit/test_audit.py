"""The PPPL audit: streamed figures equal a naive in-memory computation, outliers are the garbage,
baselines regress by the thresholds, and memory stays flat on a large corpus."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.workflows.audit.baseline_io import load_baseline
from distributed_scoring.workflows.audit.figures import NO_PARTITION, AuditConfig, LogBins, run_audit
from distributed_scoring.workflows.audit.outliers import OUTLIER_SCHEMA, ROBUST_Z, OutlierRule, robust_cutoff
from distributed_scoring.workflows.audit.verdicts import (
    EXIT_INCOMPARABLE,
    EXIT_INSUFFICIENT,
    EXIT_OK,
    EXIT_REGRESSION,
    IMPROVEMENT,
    INSUFFICIENT,
    NEW,
    NO_CHANGE,
    OVERALL,
    REGRESSION,
    VANISHED,
    Thresholds,
)

from helpers.audit import ROWS_SCHEMA, corrupt, mixed_corpus, scored_table, write_rows
from helpers.reference import audit_figures, audit_outliers

SMALL = AuditConfig(  # one corpus-wide outlier rule: what reference.audit_outliers computes
    outliers=OutlierRule(scope="overall"), histogram=LogBins(1.0, 1e4, 24), max_position=12, max_length=10, listed=15
)


def corpus(seed: int = 0) -> pa.Table:
    """Three partitions of different PPPL, error rows, rows with a null partition, and a few garbage rows."""
    rng = np.random.default_rng(seed)
    parts = [
        scored_table(rng, 300, "news", nll=1.8, lengths=(1, 14), error_rate=0.05),
        scored_table(rng, 200, "web", nll=2.6, lengths=(4, 25), error_rate=0.15),
        scored_table(rng, 40, None, nll=2.0, lengths=(2, 8)),
        scored_table(rng, 8, "news", nll=7.0, lengths=(6, 12), prefix="garbage-"),
    ]
    return pa.concat_tables(parts)


@pytest.mark.parametrize("batch_rows", [7, 4096])
def test_streamed_figures_equal_the_in_memory_reference(tmp_path, batch_rows):
    table = corpus()
    write_rows(tmp_path / "run", table, files=6, row_group_rows=50)
    config = replace(SMALL, batch_rows=batch_rows)
    audit = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=config).audit
    ref = audit_figures(table, config)

    for name, figures in [(OVERALL, audit["overall"]), *audit["partitions"].items()]:
        want = ref["sums"][name]
        assert figures["rows"] == want["rows"] and figures["errors"] == want["errors"], name
        for count in ("ok", "n_tokens", "n_words"):
            assert figures[count] == want[count], (name, count)
        assert figures["pppl_token"] == pytest.approx(math.exp(-want["sum_pll"] / want["n_tokens"]), rel=1e-12)
        assert figures["pppl_word"] == pytest.approx(math.exp(-want["sum_pll"] / want["n_words"]), rel=1e-12)
        assert figures["error_rate"] == pytest.approx(want["errors"] / want["rows"])
    assert set(audit["partitions"]) == {"news", "web", NO_PARTITION}

    for name, h in [(OVERALL, audit["histogram"]["overall"]), *audit["histogram"]["partitions"].items()]:
        assert [h["underflow"], *h["counts"], h["overflow"]] == ref["hist"][name], name
    assert sum(audit["histogram"]["overall"]["counts"]) == audit["outliers"]["eligible"]

    curves = audit["positionwise"]
    positions = sorted(ref["tokens_at"])
    assert curves["by_position"]["tokens"] == [ref["tokens_at"][t] for t in positions]
    assert curves["by_position"]["sum_nll"] == pytest.approx([ref["by_position"][t] for t in positions], rel=1e-12)
    assert len(positions) == config.max_position  # sentences reach 25 tokens; the curve stops at 12
    lengths = {int(k): v for k, v in curves["by_length"].items()}
    assert set(lengths) == {n for n in ref["sentences"] if n <= config.max_length}
    for length, curve in lengths.items():
        assert curve["sentences"] == ref["sentences"][length]
        assert curve["sum_nll"] == pytest.approx([ref["by_length"][length][t] for t in range(1, length + 1)], rel=1e-12)


def test_outliers_match_the_reference_rule_and_file(tmp_path):
    table = corpus()
    write_rows(tmp_path / "run", table, files=4, row_group_rows=37)
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=SMALL)
    want = audit_outliers(audit_figures(table, SMALL)["nll"], SMALL.outliers.k)
    flagged = pq.read_table(result.outliers_path)
    assert flagged.schema.equals(OUTLIER_SCHEMA)
    assert sorted(flagged[S.ID].to_pylist()) == sorted(want)
    assert result.audit["outliers"]["count"] == len(want) > 8

    source = {r[S.ID]: r for r in table.to_pylist()}
    for row in flagged.to_pylist():
        assert row[ROBUST_Z] == pytest.approx(want[row[S.ID]])
        assert row[S.TOKENS] == source[row[S.ID]][S.TOKENS]
        assert row[S.TOKEN_LOGPROBS] == source[row[S.ID]][S.TOKEN_LOGPROBS]
        assert row[S.TEXT] == source[row[S.ID]][S.TEXT] and row["tail"] == "high"

    listed = result.audit["outliers"]["listed"]
    assert [r[S.ID] for r in listed] == sorted(want, key=lambda i: -want[i])[: SMALL.listed]
    top = source[listed[0][S.ID]]
    assert listed[0]["worst_token"] == top[S.TOKENS][int(np.argmin(top[S.TOKEN_LOGPROBS]))]
    by_partition = defaultdict(int)
    for row in flagged.to_pylist():
        by_partition[row[S.PARTITION]] += 1
    assert result.audit["outliers"]["by_partition"] == dict(by_partition)


def test_short_sentences_are_never_flagged_below_min_tokens(tmp_path):
    table = corpus()
    write_rows(tmp_path / "run", table, files=2)
    config = replace(SMALL, outliers=OutlierRule(min_tokens=6))
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=config)
    n_tokens = dict(zip(table[S.ID].to_pylist(), table[S.N_TOKENS].to_pylist()))
    long_enough = {i: x for i, x in audit_figures(table, config)["nll"].items() if n_tokens[i] >= 6}
    assert result.audit["outliers"]["eligible"] == len(long_enough)
    flagged = pq.read_table(result.outliers_path)
    assert min(flagged[S.N_TOKENS].to_pylist()) >= 6
    assert sorted(flagged[S.ID].to_pylist()) == sorted(audit_outliers(long_enough, config.outliers.k))


def test_garbage_rows_are_flagged_in_both_tails(tmp_path):
    rng = np.random.default_rng(3)
    table = pa.concat_tables(
        [
            scored_table(rng, 3000, "corpus", nll=2.0, spread=0.15, lengths=(40, 80)),
            scored_table(rng, 30, "corpus", nll=5.0, spread=0.3, lengths=(40, 80), prefix="shuffled-"),
            scored_table(rng, 30, "corpus", nll=0.1, spread=0.02, lengths=(40, 80), prefix="repeated-"),
        ]
    )
    write_rows(tmp_path / "run", table, files=5)
    both = AuditConfig(outliers=OutlierRule(k=4.0, low_tail=True), thresholds=Thresholds(min_rows=10))
    flagged = pq.read_table(run_audit(str(tmp_path / "run"), str(tmp_path / "both"), config=both).outliers_path)
    tails = dict(zip(flagged[S.ID].to_pylist(), flagged["tail"].to_pylist()))
    shuffled = {i for i in table[S.ID].to_pylist() if i.startswith("shuffled-")}
    repeated = {i for i in table[S.ID].to_pylist() if i.startswith("repeated-")}
    assert {i for i, t in tails.items() if t == "high"} >= shuffled
    assert {i for i, t in tails.items() if t == "low"} >= repeated
    assert len(tails) <= len(shuffled) + len(repeated) + 3  # hardly any clean sentence flagged

    high_only = AuditConfig(outliers=OutlierRule(k=4.0), thresholds=Thresholds(min_rows=10))
    flagged = pq.read_table(run_audit(str(tmp_path / "run"), str(tmp_path / "high"), config=high_only).outliers_path)
    assert set(flagged[S.ID].to_pylist()) >= shuffled and not set(flagged[S.ID].to_pylist()) & repeated


def test_partition_scope_finds_garbage_a_global_rule_misses(tmp_path):
    """A hard domain (NLL 4) hides garbage of an easy one (NLL 3.3 among 1.5) from a corpus-wide rule."""
    rng = np.random.default_rng(4)
    table = pa.concat_tables(
        [
            scored_table(rng, 1500, "easy", nll=1.5, spread=0.1, lengths=(20, 40)),
            scored_table(rng, 1500, "hard", nll=4.0, spread=0.1, lengths=(20, 40)),
            scored_table(rng, 20, "easy", nll=3.3, spread=0.1, lengths=(20, 40), prefix="garbage-"),
        ]
    )
    write_rows(tmp_path / "run", table, files=3)
    garbage = {i for i in table[S.ID].to_pylist() if i.startswith("garbage-")}

    def flagged(scope: str) -> set[str]:
        config = AuditConfig(outliers=OutlierRule(k=3.5, scope=scope), thresholds=Thresholds(min_rows=10))
        result = run_audit(str(tmp_path / "run"), str(tmp_path / scope), config=config)
        return set(pq.read_table(result.outliers_path)[S.ID].to_pylist())

    assert not flagged("overall") & garbage
    per_partition = flagged("partition")
    assert per_partition >= garbage
    assert len(per_partition - garbage) <= 10  # of 3000 clean ones: token NLLs are skewed, so a few lie far right


def test_robust_cutoff_uses_the_mad_and_falls_back_to_the_mean_deviation():
    values = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    cutoff = robust_cutoff(values, OutlierRule(k=2.0, low_tail=True))
    assert (cutoff.median, cutoff.sigma) == (3.0, pytest.approx(1.4826))
    assert (cutoff.high, cutoff.low) == (pytest.approx(3 + 2 * 1.4826), pytest.approx(3 - 2 * 1.4826))
    assert cutoff.z(values)[-1] == pytest.approx(97 / 1.4826)

    mostly_same = np.array([5.0] * 9 + [6.0])  # MAD 0: sigma from the mean absolute deviation
    assert robust_cutoff(mostly_same, OutlierRule()).sigma == pytest.approx(1.2533 * 0.1)
    constant = robust_cutoff(np.full(4, 2.0), OutlierRule(min_sigma=0))
    assert constant.sigma == 0 and not np.any(constant.z(np.full(4, 2.0)))
    assert robust_cutoff(np.empty(0), OutlierRule()) is None


def test_sigma_is_floored_and_the_report_shows_the_floor(tmp_path):
    """A partition of near-identical sentences (sigma 0.005 measured) and one 4.3 nats per token above
    them: z +87 against the floor of 0.05, not +867, and the report says the floor was used."""
    rng = np.random.default_rng(0)
    values = np.append(1.0 + rng.normal(0, 0.005, 199), 1.0 + 4.335)
    cutoff = robust_cutoff(values, OutlierRule())
    assert cutoff.measured_sigma < 0.01 and cutoff.sigma == 0.05
    assert cutoff.z(values)[-1] == pytest.approx((values[-1] - np.median(values)) / 0.05)
    assert cutoff.z(values)[-1] < 100
    assert robust_cutoff(values, OutlierRule(min_sigma=0)).z(values)[-1] > 500

    table = scored_table(rng, 60, "germline", nll=1.0, spread=0.0, lengths=(4000, 4000))  # sigma about 0.016
    write_rows(tmp_path / "run", table, files=1)
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=SMALL)
    recorded = result.audit["outliers"]
    assert recorded["rule"]["min_sigma"] == 0.05 and recorded["cutoffs"][OVERALL]["sigma"] == 0.05
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "sigma at least 0.05 nats per token" in html and "sigma 0.050 (the floor: 0.01" in html


def test_rows_without_per_token_columns_still_get_figures_and_outliers(tmp_path):
    table = corpus().drop_columns([S.TOKENS, S.TOKEN_LOGPROBS])
    write_rows(tmp_path / "run", table, files=2)
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=SMALL)
    assert result.audit["positionwise"] is None
    flagged = pq.read_table(result.outliers_path)
    assert flagged.num_rows == result.audit["outliers"]["count"] > 0
    assert flagged[S.TOKENS].null_count == flagged.num_rows
    assert result.audit["outliers"]["listed"][0]["worst_token"] is None


def test_missing_partition_column_and_empty_folder_are_user_errors(tmp_path):
    write_rows(tmp_path / "run", corpus().drop_columns([S.PARTITION]), files=1)
    with pytest.raises(UserError, match="partition"):
        run_audit(str(tmp_path / "run"), str(tmp_path / "audit"))
    config = AuditConfig(partition_column=S.MODEL)  # any string column can partition
    audit = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=config).audit
    assert set(audit["partitions"]) == {"tiny-bert"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no scored rows"):
        run_audit(str(tmp_path / "empty"), str(tmp_path / "audit"))


def test_invalid_configuration_is_refused():
    with pytest.raises(UserError):
        Thresholds(metric="accuracy")
    with pytest.raises(UserError):
        Thresholds(max_pppl_increase=-0.1)
    with pytest.raises(UserError):
        OutlierRule(k=0)
    with pytest.raises(UserError):
        OutlierRule(scope="file")
    with pytest.raises(UserError):
        LogBins(low=10, high=1)


# --- baselines: verdicts read from intervals ----------------------------------------------------------

NIGHT = AuditConfig(listed=5, max_position=40, max_length=40)
FIFTY_PERCENT = math.log(1.5)  # NLL per token shift that multiplies PPPL by 1.5


def audit_rows(
    tmp_path: Path, name: str, table: pa.Table, baseline: str | None = None, thresholds: Thresholds = Thresholds()
):
    write_rows(tmp_path / f"{name}-rows", table, files=2)
    return run_audit(
        str(tmp_path / f"{name}-rows"), str(tmp_path / name), baseline, replace(NIGHT, thresholds=thresholds)
    )


def statuses(result) -> dict[str, str]:
    c = result.comparison
    return {check.name: check.status for check in (c.overall, *c.partitions)}


def night(seed: int, shift: float = 0.0, prefix: str = "", sizes=(60, 20)) -> pa.Table:
    """Two partitions of 20-60 antibody-chain-like sentences (90-120 tokens); `shift` adds to the NLL per
    token of every sentence (`scored_table` draws token NLLs from an exponential, noisier than real chains)."""
    rng = np.random.default_rng(seed)
    return pa.concat_tables(
        [
            scored_table(rng, sizes[0], "human", nll=1.0 + shift, spread=0.1, lengths=(90, 120), prefix=prefix),
            scored_table(rng, sizes[1], "mouse", nll=1.3 + shift, spread=0.1, lengths=(90, 120), prefix=prefix),
        ]
    )


def test_a_fifty_percent_rise_on_small_partitions_is_a_regression(tmp_path):
    base = audit_rows(tmp_path, "base", night(0))
    result = audit_rows(tmp_path, "now", night(1, FIFTY_PERCENT, prefix="new-"), str(tmp_path / "base"))
    assert result.exit_code == EXIT_REGRESSION and result.comparison.verdict == "regression"
    assert statuses(result) == {OVERALL: REGRESSION, "human": REGRESSION, "mouse": REGRESSION}
    overall = result.comparison.overall
    assert not overall.paired and 1.05 < overall.pppl_ratio_low < 1.5 < overall.pppl_ratio_high
    assert "lies above the allowed +5.0%" in overall.reasons[0]
    assert base.audit["row_stats"] == "row_stats.parquet"


def test_a_pppl_regression_lists_only_its_own_reasons(tmp_path):
    """Error-free partitions of 20 rows: the error-rate change (0.00% -> 0.00%) has an interval that crosses
    the +-1 point band, which alone would be insufficient data; under a PPPL regression it is no reason."""
    audit_rows(tmp_path, "base", night(0))
    result = audit_rows(tmp_path, "now", night(1, FIFTY_PERCENT, prefix="new-"), str(tmp_path / "base"))
    mouse = next(c for c in result.comparison.partitions if c.name == "mouse")
    assert mouse.status == REGRESSION and mouse.error_rate_verdict == INSUFFICIENT
    assert len(mouse.reasons) == 1 and "lies above the allowed +5.0%" in mouse.reasons[0]
    html = (tmp_path / "now" / "report.html").read_text()
    banner = html[html.index("<div class='verdict") :]
    assert "error rate" not in banner[: banner.index("</div>")]


def test_the_same_rows_against_themselves_are_no_change(tmp_path):
    audit_rows(tmp_path, "base", night(0))
    result = audit_rows(tmp_path, "again", night(0), str(tmp_path / "base" / "audit.json"))
    assert result.exit_code == EXIT_OK and result.comparison.verdict == "pass"
    assert set(statuses(result).values()) == {NO_CHANGE}
    check = result.comparison.overall
    assert check.paired and check.pppl_ratio_low == check.pppl_ratio_high == pytest.approx(1.0)


def test_the_same_corpus_scored_again_slightly_worse_is_judged_paired(tmp_path):
    """Same ids, each sentence 2 % worse (PPPL ratio 1.02): inside the band, and the paired interval is
    tight enough to say so; 20 % worse is a regression, 20 % better an improvement."""
    audit_rows(tmp_path, "base", night(0))
    table = night(0)
    for shift, expected in ((math.log(1.02), NO_CHANGE), (math.log(1.2), REGRESSION), (math.log(0.8), IMPROVEMENT)):
        moved = table.set_column(
            table.schema.get_field_index(S.PLL),
            S.PLL,
            pa.array(np.asarray(table[S.PLL]) - shift * np.asarray(table[S.N_TOKENS])),
        )
        result = audit_rows(tmp_path, f"shift{shift:.3f}", moved, str(tmp_path / "base"))
        assert result.comparison.overall.paired and result.comparison.overall.status == expected, result.comparison
    assert result.exit_code == EXIT_OK  # an improvement passes


def test_a_fall_beyond_max_pppl_decrease_is_a_regression(tmp_path, tiny_model_dir):
    """A corpus 20 % easier than last night (duplicated or leaked text) fails when a fall is bounded
    (`--max-pppl-decrease 0.1`); the flag reaches the audit's thresholds from the command line."""
    from distributed_scoring.cli import main

    audit_rows(tmp_path, "base", night(0))
    table = night(0)
    easier = table.set_column(
        table.schema.get_field_index(S.PLL),
        S.PLL,
        pa.array(np.asarray(table[S.PLL]) - math.log(0.8) * np.asarray(table[S.N_TOKENS])),
    )
    result = audit_rows(tmp_path, "easier", easier, str(tmp_path / "base"), Thresholds(max_pppl_decrease=0.1))
    assert result.exit_code == EXIT_REGRESSION and result.comparison.overall.status == REGRESSION
    assert "lies below the allowed -10.0%" in result.comparison.overall.reasons[0]

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick fox\njumps over the dog\n")
    out = tmp_path / "cli"
    assert (
        main(
            [
                "audit",
                str(corpus),
                "--model",
                str(tiny_model_dir("bert")),
                "--output",
                str(out),
                "--max-pppl-decrease",
                "0.1",
            ]
        )
        == EXIT_OK
    )
    assert json.loads((out / "audit.json").read_text())["config"]["thresholds"]["max_pppl_decrease"] == 0.1
    assert (
        main(
            [
                "audit",
                str(corpus),
                "--model",
                str(tiny_model_dir("bert")),
                "--output",
                str(tmp_path / "bad"),
                "--max-pppl-decrease",
                "1.5",
            ]
        )
        == 2
    )


def test_five_rows_are_insufficient_data_and_never_a_pass(tmp_path):
    audit_rows(tmp_path, "base", night(0, sizes=(5, 5)))
    result = audit_rows(tmp_path, "now", night(1, prefix="new-", sizes=(5, 5)), str(tmp_path / "base"))
    assert result.exit_code == EXIT_INSUFFICIENT and result.comparison.verdict == INSUFFICIENT
    assert statuses(result) == {OVERALL: INSUFFICIENT, "human": INSUFFICIENT, "mouse": INSUFFICIENT}
    assert "fewer than 10 rows" in result.comparison.partitions[0].reasons[0]
    accepted = audit_rows(
        tmp_path,
        "accepted",
        night(1, prefix="new-", sizes=(5, 5)),
        str(tmp_path / "base"),
        Thresholds(accept_insufficient=True),
    )
    assert accepted.exit_code == EXIT_OK and accepted.audit["baseline"]["insufficient"]


def test_garbage_rows_that_raise_corpus_pppl_by_half_fail_the_audit(tmp_path):
    """The issue's case: a baseline of 80 clean rows (60 + 20); tonight the same 80 plus 15 garbage rows."""
    clean = night(0)
    audit_rows(tmp_path, "base", clean)
    garbage = scored_table(np.random.default_rng(9), 15, "human", nll=3.0, lengths=(90, 120), prefix="garbage-")
    result = audit_rows(tmp_path, "now", pa.concat_tables([clean, garbage]), str(tmp_path / "base"))
    assert result.exit_code == EXIT_REGRESSION
    assert statuses(result)[OVERALL] == REGRESSION and statuses(result)["human"] == REGRESSION
    assert statuses(result)["mouse"] == NO_CHANGE  # the same 20 rows: paired, identical


def test_one_error_row_in_a_small_scope_is_not_an_error_rate_regression(tmp_path):
    rng = np.random.default_rng(3)
    audit_rows(tmp_path, "base", scored_table(rng, 80, "web", lengths=(10, 20)))
    now = scored_table(rng, 13, "web", lengths=(10, 20), prefix="n")
    now = now.set_column(
        now.schema.get_field_index(S.STATUS), S.STATUS, pa.array([S.STATUS_ERROR] + [S.STATUS_OK] * 12)
    )
    result = audit_rows(tmp_path, "now", now, str(tmp_path / "base"))
    check = result.comparison.overall
    assert check.error_rate_verdict == INSUFFICIENT and check.error_rate_change_low < 0.01 < check.error_rate_change
    assert result.exit_code == EXIT_INSUFFICIENT


def test_error_rate_rise_on_a_large_scope_is_a_regression(tmp_path):
    rng = np.random.default_rng(4)
    audit_rows(tmp_path, "base", scored_table(rng, 3000, "web", lengths=(5, 10), error_rate=0.01))
    now = scored_table(rng, 3000, "web", lengths=(5, 10), error_rate=0.06, prefix="n")
    result = audit_rows(tmp_path, "now", now, str(tmp_path / "base"))
    check = result.comparison.overall
    assert check.error_rate_verdict == REGRESSION and check.error_rate_change_low > 0.01
    assert "error rate" in " ".join(check.reasons) and result.exit_code == EXIT_REGRESSION


def test_verdicts_are_reproducible_and_seeded(tmp_path):
    audit_rows(tmp_path, "base", night(0))
    runs = [
        audit_rows(tmp_path, f"r{i}", night(1, 0.1, prefix="n"), str(tmp_path / "base"), Thresholds(seed=seed))
        for i, seed in enumerate((7, 7, 8))
    ]
    bounds = [(r.comparison.overall.pppl_ratio_low, r.comparison.overall.pppl_ratio_high) for r in runs]
    assert bounds[0] == bounds[1] and bounds[0] != bounds[2]
    assert runs[0].audit["baseline"]["thresholds"]["seed"] == 7


def test_new_and_vanished_partitions_are_reported_not_judged(tmp_path):
    rng = np.random.default_rng(5)
    audit_rows(tmp_path, "base", pa.concat_tables([scored_table(rng, 50, "a"), scored_table(rng, 50, "b")]))
    now = pa.concat_tables([scored_table(np.random.default_rng(5), 50, "a"), scored_table(rng, 50, "c", nll=5.0)])
    result = audit_rows(tmp_path, "now", now, str(tmp_path / "base"))
    assert result.comparison.new_partitions == ("c",) and result.comparison.vanished_partitions == ("b",)
    assert statuses(result)["a"] == NO_CHANGE
    as_dict = result.audit["baseline"]
    assert as_dict["partitions"]["c"]["status"] == NEW and as_dict["partitions"]["b"]["status"] == VANISHED
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_other_model_is_incomparable_but_error_rates_still_judged(tmp_path):
    table = night(0)
    audit_rows(tmp_path, "base", table)
    other = table.set_column(table.schema.get_field_index(S.MODEL), S.MODEL, pa.array(["roberta"] * table.num_rows))
    result = audit_rows(tmp_path, "other", other, str(tmp_path / "base"))
    assert result.exit_code == EXIT_INCOMPARABLE and "roberta" in result.comparison.signature_mismatch
    assert result.comparison.overall.pppl_verdict is None and result.comparison.overall.error_rate_verdict == NO_CHANGE


def test_word_metric_is_judged_when_chosen(tmp_path):
    table = night(0)
    audit_rows(tmp_path, "base", table)
    fewer_words = table.set_column(table.schema.get_field_index(S.N_WORDS), S.N_WORDS, pc_divide(table[S.N_WORDS], 2))
    assert audit_rows(tmp_path, "token", fewer_words, str(tmp_path / "base")).exit_code == EXIT_OK
    word = audit_rows(tmp_path, "word", fewer_words, str(tmp_path / "base"), Thresholds(metric="pppl_word"))
    assert word.exit_code == EXIT_REGRESSION


def pc_divide(column, by: int) -> pa.Array:
    return pa.array(np.maximum(1, np.asarray(column) // by).astype(np.int32))


def test_an_audit_json_of_version_1_is_still_read_as_a_baseline(tmp_path):
    """tests/data/audit_v1/audit.json was written by the code before intervals (schema version 1)."""
    v1 = Path(__file__).resolve().parents[2] / "data" / "audit_v1" / "audit.json"
    record, uri = load_baseline(str(v1))
    assert record.version == 1 and record.row_stats is None and uri == str(v1)
    result = audit_rows(tmp_path, "now", night(0), str(v1))
    assert result.exit_code == EXIT_INSUFFICIENT
    assert "no per-row figures" in result.comparison.overall.reasons[0]
    accepted = audit_rows(tmp_path, "ok", night(0), str(v1), Thresholds(accept_insufficient=True))
    assert accepted.exit_code == EXIT_OK


def test_exit_codes_are_distinct_from_the_cli_ones():
    assert EXIT_OK == 0
    assert len({EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE, EXIT_INSUFFICIENT, 1, 2}) == 6


def test_bad_baselines_fail_before_any_work(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        run_audit(str(tmp_path / "nowhere"), str(tmp_path / "out"), baseline=str(tmp_path / "missing.json"))
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(UserError, match="schema version"):
        load_baseline(str(tmp_path / "old.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read"):
        load_baseline(str(tmp_path / "broken.json"))
    (tmp_path / "partial.json").write_text(json.dumps({"schema_version": 2, "overall": {}}))
    with pytest.raises(UserError, match="not an audit.json"):
        load_baseline(str(tmp_path / "partial.json"))


# --- garbage helpers (for the real-weight audit) ------------------------------------------------------


def test_corruptions_keep_units_but_change_the_sentence():
    import random

    text = "E V Q L V E S G G G L V Q P G G S L R L S C A A S"
    rng = random.Random(0)
    shuffled = corrupt(text, rng, "shuffle")
    assert sorted(shuffled.split()) == sorted(text.split()) and shuffled != text
    substituted = corrupt(text, rng, "substitute", rate=0.5)
    assert len(substituted.split()) == len(text.split()) and substituted != text
    assert set(substituted.split()) <= set(text.split())
    repeated = corrupt(text, rng, "repeat")
    assert len(repeated.split()) == len(text.split()) and len(set(repeated.split())) < len(set(text.split()))
    rows = mixed_corpus([text, "Q V Q L", "D I Q M T Q"], fraction=0.34, seed=1)
    assert sum(r["garbage"] for r in rows) == 1 and len(rows) == 4


# --- memory --------------------------------------------------------------------------------------------

_MEASURE = textwrap.dedent(
    """
    import json, sys, tracemalloc
    import pyarrow as pa
    from distributed_scoring.workflows.audit.figures import run_audit

    def rss_kib(field):  # VmHWM is the peak since the last reset; ru_maxrss would carry pytest's peak over exec
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

    small, large, out = sys.argv[1:]
    run_audit(small, out + "/warm-up")  # lazy imports (pyarrow.compute, matplotlib, fonts) are paid here

    def measured(rows):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset VmHWM to the current RSS
        rss_before = rss_kib("VmRSS")
        tracemalloc.start()
        result = run_audit(rows, out + "/audit")
        _, python_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {
            "python_peak": python_peak,
            "arrow_peak": pa.default_memory_pool().max_memory(),
            "rss_growth": (rss_kib("VmHWM") - rss_before) * 1024,
            "rss_peak": rss_kib("VmHWM") * 1024,
            "rows": result.audit["overall"]["rows"],
        }

    print(json.dumps({"small": measured(small), "large": measured(large)}))
    """
)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is read from Linux /proc")
def test_memory_stays_flat_on_a_large_corpus(tmp_path):
    """300,000 sentences with per-token lists (over 150 MB in Arrow) audited in a fresh process:
    Python (tracemalloc) and Arrow allocations peak at a small fraction of the data, barely above a
    corpus 100 times smaller."""
    rng = np.random.default_rng(6)

    def corpus_of(rows: int) -> pa.Table:
        return pa.concat_tables(
            [scored_table(rng, rows // 6, f"source-{i}", nll=1.5 + 0.2 * i, lengths=(10, 50)) for i in range(6)]
        )

    write_rows(tmp_path / "small", corpus_of(3_000), files=3)
    large = corpus_of(300_000)
    assert large.schema.equals(ROWS_SCHEMA)  # what `dscore score --per-token` writes, plus the partition
    data_bytes = large.nbytes
    write_rows(tmp_path / "large", large, files=30)
    del large
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "small"), str(tmp_path / "large"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    small, big = json.loads(done.stdout.strip().splitlines()[-1]).values()
    print({"data_bytes": data_bytes, "small": small, "large": big})
    assert (small["rows"], big["rows"]) == (3_000, 300_000) and data_bytes > 150e6
    assert big["arrow_peak"] < data_bytes / 10  # bounded by a row group of the widest columns, not the corpus
    assert big["python_peak"] < data_bytes / 10
    assert big["python_peak"] - small["python_peak"] < 100 * (300_000 - 3_000)  # a few numbers per sentence
    assert big["rss_growth"] < data_bytes / 2  # allocator slack included; holding the data would add all of it


@pytest.mark.parametrize(
    "damage",
    [
        {"signature": {"model": "m"}},
        {"signature": ["m"]},
        {"overall": {}},
        {"overall": {"rows": "80", "error_rate": 0.0, "pppl_token": 1.0, "pppl_word": 1.0}},
        {"partitions": []},
        {"partitions": {"news": None}},
    ],
)
def test_a_malformed_audit_json_is_one_line_before_any_scoring(tmp_path, tiny_model_dir, capsys, damage):
    """An audit.json with the right keys but unreadable contents used to end in a KeyError traceback,
    after the whole snapshot was scored on Ray."""
    from distributed_scoring.cli import main

    v1 = json.loads((Path(__file__).resolve().parents[2] / "data" / "audit_v1" / "audit.json").read_text())
    baseline = tmp_path / "audit.json"
    baseline.write_text(json.dumps({**v1, **damage}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick fox\n")
    model, out = tiny_model_dir("bert"), tmp_path / "out"
    capsys.readouterr()
    rc = main(["audit", str(corpus), "--model", str(model), "--output", str(out), "--baseline", str(baseline)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "malformed" in err and "pass a previous run's audit.json" in err
    assert not out.exists()


def many_partitions(seed: int, shift: float = 0.0, parts: int = 40) -> pa.Table:
    """`parts` partitions of 25 rows each (some of them harder), their rows interleaved across the files."""
    rng = np.random.default_rng(seed)
    table = pa.concat_tables(
        [
            scored_table(rng, 25, f"p{p:02d}", nll=1.5 + 0.05 * p + shift, spread=0.3, lengths=(4, 20), error_rate=0.04)
            for p in range(parts)
        ]
    )
    return table.take(pa.array(rng.permutation(table.num_rows)))


def test_outliers_per_partition_equal_a_rule_applied_to_each_partition_alone(tmp_path):
    """The rule is applied to each partition's rows alone (here: a filter per partition, the reference), with
    40 partitions interleaved in 5 files: the grouped computation must give each flagged row the same z."""
    table = many_partitions(7)
    write_rows(tmp_path / "run", table, files=5, row_group_rows=60)
    rule = OutlierRule(k=1.5, low_tail=True)  # a low k: many rows flagged in every partition
    result = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=replace(SMALL, outliers=rule))
    nll = audit_figures(table, SMALL)["nll"]  # NLL per token of the eligible rows, by id
    partition_of = dict(zip(table[S.ID].to_pylist(), table[S.PARTITION].to_pylist()))
    want = {}
    for name in set(partition_of.values()):
        ids = [i for i in nll if partition_of[i] == name]
        cutoff = robust_cutoff(np.array([nll[i] for i in ids]), rule)
        want.update({i: z for i, z in zip(ids, cutoff.z(np.array([nll[i] for i in ids]))) if abs(z) > rule.k})
    flagged = pq.read_table(result.outliers_path).to_pylist()
    assert {row[S.ID] for row in flagged} == set(want) and len(want) > 100
    for row in flagged:
        assert row[ROBUST_Z] == pytest.approx(want[row[S.ID]], abs=1e-12)
        assert row[S.PARTITION] == partition_of[row[S.ID]]


def test_each_partitions_verdict_is_judged_on_its_own_rows(tmp_path):
    """With 40 interleaved partitions against a baseline, every partition's figures and interval are those of
    its own rows: its PPPL ratio estimate is the ratio of its rows' PPPLs computed here, paired or not."""
    from distributed_scoring.workflows.audit.baseline import _by_partition

    base = many_partitions(8)
    now = many_partitions(9, shift=0.02)
    audit_rows(tmp_path, "base", base)
    result = audit_rows(tmp_path, "now", now, str(tmp_path / "base"), Thresholds(min_rows=10))
    checks = {c.name: c for c in result.comparison.partitions}
    assert len(checks) == 40

    def pppl(table: pa.Table, name: str) -> float:
        rows = table.filter(pc.and_(pc.equal(table[S.PARTITION], name), pc.equal(table[S.STATUS], S.STATUS_OK)))
        return math.exp(-sum(rows[S.PLL].to_pylist()) / sum(rows[S.N_TOKENS].to_pylist()))

    for name, check in checks.items():
        assert check.pppl_ratio == pytest.approx(pppl(now, name) / pppl(base, name), rel=1e-9), name
        assert check.rows == 25 and check.baseline_rows == 25
    grouped = _by_partition(now)
    for name in checks:  # each partition's rows, in their order: what a filter gives
        assert grouped[name].equals(now.filter(pc.equal(now[S.PARTITION], name)))


def test_an_audit_of_documents_scores_the_long_ones_in_windows_and_reports_their_share(tmp_path, tiny_model_dir):
    """Documents longer than the model's window (96 tokens for the tiny BERT) used to be error rows, so an
    audit of documents judged mostly errors. They are scored in windows by default; audit.json and the report
    say how many; `--long-texts error` keeps the error rows."""
    import contextlib
    import io

    from distributed_scoring.cli import main

    corpus = tmp_path / "docs.jsonl"
    docs = [" ".join(["the quick brown fox jumps over the lazy dog ."] * k) for k in (1, 12, 2, 25, 3)]
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs)))

    def audit(folder: str, *extra: str) -> dict:
        args = ["audit", str(corpus), "--id-column", "id", "--model", str(tiny_model_dir("bert")), "--output"]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([*args, str(tmp_path / folder), *extra]) == 0
        return json.loads((tmp_path / folder / "audit.json").read_text())

    windowed = audit("windows")
    assert windowed["windowed_rows"] == 2 and windowed["overall"]["errors"] == 0
    assert "scored in windows (2 rows longer than the model" in (tmp_path / "windows" / "report.html").read_text()
    rows = pq.read_table(tmp_path / "windows" / "rows").to_pylist()
    assert sorted(r[S.ID] for r in rows if r[S.WINDOWED]) == ["d1", "d3"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["verify", str(tmp_path / "windows")]) == 0
    strict = audit("errors", "--long-texts", "error")
    assert "windowed_rows" not in strict and strict["overall"]["errors"] == 2
