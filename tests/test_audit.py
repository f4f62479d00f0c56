"""The PPPL audit: streamed figures equal a naive in-memory computation, outliers are the garbage,
baselines regress by the thresholds, and memory stays flat on a large corpus."""

from __future__ import annotations

import bisect
import json
import math
import statistics
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from audit_helpers import ROWS_SCHEMA, corrupt, mixed_corpus, scored_table, write_rows
from distributed_scoring import schema as S
from distributed_scoring.audit import NO_PARTITION, AuditConfig, LogBins, run_audit
from distributed_scoring.baseline import (
    EXIT_INCOMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    OVERALL,
    Thresholds,
    compare,
    load_baseline,
)
from distributed_scoring.errors import UserError
from distributed_scoring.outliers import OUTLIER_SCHEMA, ROBUST_Z, OutlierRule, robust_cutoff

SMALL = AuditConfig(
    thresholds=Thresholds(min_rows=10), histogram=LogBins(1.0, 1e4, 24), max_position=12, max_length=10, listed=15
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


# --- the naive reference: the whole table in memory, plain Python loops ----------------------------


def reference(table: pa.Table, config: AuditConfig) -> dict:
    rows = table.to_pylist()
    bins = config.histogram
    edges = [bins.low * (bins.high / bins.low) ** (i / bins.bins) for i in range(bins.bins + 1)]
    sums = defaultdict(lambda: defaultdict(float))
    hist = defaultdict(lambda: [0] * (bins.bins + 2))
    by_position, tokens_at = defaultdict(float), defaultdict(int)
    by_length, sentences = defaultdict(lambda: defaultdict(float)), defaultdict(int)
    nll_of = {}
    for row in rows:
        for name in (row[S.PARTITION] if row[S.PARTITION] is not None else NO_PARTITION, OVERALL):
            figures = sums[name]
            figures["rows"] += 1
            if row[S.STATUS] != "ok":
                figures["errors"] += 1
                continue
            figures["ok"] += 1
            figures["sum_pll"] += row[S.PLL]
            figures["n_tokens"] += row[S.N_TOKENS]
            figures["n_words"] += row[S.N_WORDS]
            if row[S.N_TOKENS]:
                hist[name][bisect.bisect_right(edges, math.exp(-row[S.PLL] / row[S.N_TOKENS]))] += 1
        if row[S.STATUS] != "ok" or not row[S.N_TOKENS]:
            continue
        nll_of[row[S.ID]] = -row[S.PLL] / row[S.N_TOKENS]
        length = len(row[S.TOKEN_LOGPROBS])
        sentences[length] += 1
        for t, logprob in enumerate(row[S.TOKEN_LOGPROBS], 1):
            if t <= config.max_position:
                by_position[t] -= logprob
                tokens_at[t] += 1
            if length <= config.max_length:
                by_length[length][t] -= logprob
    return {"sums": sums, "hist": hist, "by_position": by_position, "tokens_at": tokens_at,
            "by_length": by_length, "sentences": sentences, "nll": nll_of}


def reference_outliers(nll: dict[str, float], k: float) -> dict[str, float]:
    """id -> robust z of the sentences beyond median + k * 1.4826 * MAD."""
    median = statistics.median(nll.values())
    sigma = 1.4826 * statistics.median(abs(x - median) for x in nll.values())
    z = {i: (x - median) / sigma for i, x in nll.items()}
    return {i: v for i, v in z.items() if v > k}


@pytest.mark.parametrize("batch_rows", [7, 4096])
def test_streamed_figures_equal_the_in_memory_reference(tmp_path, batch_rows):
    table = corpus()
    write_rows(tmp_path / "run", table, files=6, row_group_rows=50)
    config = replace(SMALL, batch_rows=batch_rows)
    audit = run_audit(str(tmp_path / "run"), str(tmp_path / "audit"), config=config).audit
    ref = reference(table, config)

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
    want = reference_outliers(reference(table, SMALL)["nll"], SMALL.outliers.k)
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
    long_enough = {i: x for i, x in reference(table, config)["nll"].items() if n_tokens[i] >= 6}
    assert result.audit["outliers"]["eligible"] == len(long_enough)
    flagged = pq.read_table(result.outliers_path)
    assert min(flagged[S.N_TOKENS].to_pylist()) >= 6
    assert sorted(flagged[S.ID].to_pylist()) == sorted(reference_outliers(long_enough, config.outliers.k))


def test_garbage_rows_are_flagged_in_both_tails(tmp_path):
    rng = np.random.default_rng(3)
    table = pa.concat_tables([
        scored_table(rng, 3000, "corpus", nll=2.0, spread=0.15, lengths=(40, 80)),
        scored_table(rng, 30, "corpus", nll=5.0, spread=0.3, lengths=(40, 80), prefix="shuffled-"),
        scored_table(rng, 30, "corpus", nll=0.1, spread=0.02, lengths=(40, 80), prefix="repeated-"),
    ])
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
    table = pa.concat_tables([
        scored_table(rng, 1500, "easy", nll=1.5, spread=0.1, lengths=(20, 40)),
        scored_table(rng, 1500, "hard", nll=4.0, spread=0.1, lengths=(20, 40)),
        scored_table(rng, 20, "easy", nll=3.3, spread=0.1, lengths=(20, 40), prefix="garbage-"),
    ])
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
    constant = robust_cutoff(np.full(4, 2.0), OutlierRule())
    assert constant.sigma == 0 and not np.any(constant.z(np.full(4, 2.0)))
    assert robust_cutoff(np.empty(0), OutlierRule()) is None


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


# --- baselines and regressions ----------------------------------------------------------------------


def audit_of(partitions: dict[str, tuple[int, int, float]], model: str = "bert", variant: str = "original") -> dict:
    """A minimal audit.json dict: partition -> (rows, errors, pppl_token); pppl_word = 2 * pppl_token."""

    def figures(rows: int, errors: int, pppl: float | None) -> dict:
        return {"rows": rows, "errors": errors, "error_rate": errors / rows if rows else 0.0, "pppl_token": pppl,
                "pppl_word": None if pppl is None else 2 * pppl}

    total_rows = sum(r for r, _, _ in partitions.values())
    total_errors = sum(e for _, e, _ in partitions.values())
    mean = statistics.fmean(p for _, _, p in partitions.values()) if partitions else None
    return {
        "schema_version": 1,
        "signature": {S.MODEL: model, S.VARIANT: variant},
        "overall": figures(total_rows, total_errors, mean),
        "partitions": {name: figures(*f) for name, f in partitions.items()},
    }


BASE = {"a": (1000, 10, 10.0), "b": (1000, 10, 20.0)}


@pytest.mark.parametrize(
    "a, regressed, reason",
    [
        ((1000, 10, 10.4), [], None),  # +4 % PPPL: holds
        ((1000, 10, 10.6), ["a"], "pppl_token rose"),  # +6 %: regresses
        ((1000, 19, 10.0), [], None),  # +0.9 points of errors: holds
        ((1000, 30, 10.0), ["a"], "error rate rose"),  # +2 points: regresses
        ((1000, 10, 7.0), [], None),  # PPPL drops are not judged by default
        ((50, 40, 50.0), [], None),  # too few rows: reported, not judged
    ],
)
def test_partition_thresholds(a, regressed, reason):
    current = audit_of({"a": a, "b": BASE["b"]})
    current["overall"] = audit_of(BASE)["overall"]  # keep the corpus out of this table
    thresholds = Thresholds(max_pppl_increase=0.05, max_error_rate_increase=0.01)
    comparison = compare(current, audit_of(BASE), "base.json", thresholds)
    assert [c.name for c in comparison.regressions] == regressed
    assert comparison.exit_code == (EXIT_REGRESSION if regressed else EXIT_OK)
    assert comparison.verdict == ("regression" if regressed else "pass")
    if reason:
        assert reason in comparison.regressions[0].reasons[0]
    if a[0] < 100:
        assert comparison.to_dict()["partitions"]["a"]["status"] == "skipped"


def test_relative_change_and_decrease_threshold():
    current = audit_of({"a": (1000, 10, 8.0), "b": BASE["b"]})
    check = compare(current, audit_of(BASE), "base.json").partitions[0]
    assert check.pppl_change == pytest.approx(-0.2) and check.status == "ok"
    strict = compare(current, audit_of(BASE), "base.json", Thresholds(max_pppl_decrease=0.1))
    assert [c.name for c in strict.regressions] == ["a"]  # the corpus fell 6.7 %: within 10 %
    assert "pppl_token fell -20.0%" in strict.partitions[0].reasons[0]


def test_word_metric_is_judged_when_chosen():
    current = audit_of({"a": (1000, 10, 10.0), "b": BASE["b"]})
    current["partitions"]["a"]["pppl_word"] = 30.0  # token PPPL unchanged, word PPPL +50 %
    assert compare(current, audit_of(BASE), "b").regressions == ()
    assert [c.name for c in compare(current, audit_of(BASE), "b", Thresholds(metric="pppl_word")).regressions] == ["a"]


def test_new_and_vanished_partitions_are_reported_not_regressions():
    current = audit_of({"a": BASE["a"], "c": (500, 400, 99.0)})
    current["overall"] = audit_of(BASE)["overall"]
    comparison = compare(current, audit_of(BASE), "base.json")
    assert comparison.new_partitions == ("c",) and comparison.vanished_partitions == ("b",)
    assert comparison.regressions == () and comparison.exit_code == EXIT_OK
    as_dict = comparison.to_dict()
    assert as_dict["partitions"]["c"]["status"] == "new" and as_dict["partitions"]["c"]["baseline_pppl"] is None
    assert as_dict["partitions"]["b"]["status"] == "vanished" and as_dict["partitions"]["b"]["baseline_pppl"] == 20.0
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_other_model_is_incomparable_but_error_rates_still_judged():
    current = audit_of({"a": (1000, 10, 50.0), "b": BASE["b"]}, model="roberta")
    comparison = compare(current, audit_of(BASE), "base.json")
    assert comparison.regressions == () and comparison.exit_code == EXIT_INCOMPARABLE
    assert "roberta" in comparison.signature_mismatch
    broken = audit_of({"a": (1000, 100, 50.0), "b": BASE["b"]}, model="roberta")
    assert compare(broken, audit_of(BASE), "base.json").exit_code == EXIT_REGRESSION
    empty = dict(audit_of({}), signature=[])  # a baseline without rows has no scorer to disagree with
    assert compare(current, empty, "empty.json").signature_mismatch is None


def test_exit_codes_are_distinct_from_the_cli_ones():
    assert EXIT_OK == 0
    assert len({EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE, 1, 2}) == 5


def test_run_audit_against_a_previous_audit(tmp_path):
    rng = np.random.default_rng(5)
    def night(web_nll: float, extra: str) -> pa.Table:
        return pa.concat_tables([scored_table(rng, 1000, "news", nll=2.0, lengths=(30, 60)),
                                 scored_table(rng, 1000, "web", nll=web_nll, lengths=(30, 60)),
                                 scored_table(rng, 150, extra, nll=2.0)])

    yesterday, today = night(2.5, "old"), night(3.0, "fresh")
    write_rows(tmp_path / "yesterday", yesterday, files=2)
    write_rows(tmp_path / "today", today, files=2)
    first = run_audit(str(tmp_path / "yesterday"), str(tmp_path / "a1"))
    assert first.exit_code == EXIT_OK and first.audit["baseline"] is None

    baseline_uri = "file://" + str(tmp_path / "a1" / "audit.json")
    result = run_audit(str(tmp_path / "today" / "rows"), str(tmp_path / "a2"), baseline=baseline_uri)
    assert result.exit_code == EXIT_REGRESSION
    written = json.loads(Path(result.audit_path).read_text())
    assert written == json.loads(json.dumps(result.audit))
    assert written["baseline"]["regressed"][-1] == "web" and "news" not in written["baseline"]["regressed"]
    assert written["baseline"]["new_partitions"] == ["fresh"] and written["baseline"]["vanished_partitions"] == ["old"]
    assert written["baseline"]["exit_code"] == EXIT_REGRESSION

    same_uri = (tmp_path / "a3").as_uri()  # output to a URI; the baseline given as its folder
    same = run_audit(str(tmp_path / "today"), same_uri, baseline=str(tmp_path / "a2"))
    assert same.exit_code == EXIT_OK and same.comparison.regressions == ()
    assert load_baseline(same.audit_path)["overall"] == result.audit["overall"]
    assert pq.read_table(str(tmp_path / "a3" / "outliers.parquet")).num_rows == same.audit["outliers"]["count"]


def test_bad_baselines_fail_before_any_work(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        run_audit(str(tmp_path / "nowhere"), str(tmp_path / "out"), baseline=str(tmp_path / "missing.json"))
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(UserError, match="schema version"):
        load_baseline(str(tmp_path / "old.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read"):
        load_baseline(str(tmp_path / "broken.json"))


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
    from distributed_scoring.audit import run_audit

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
        capture_output=True, text=True, timeout=300, check=True,
    )
    small, big = json.loads(done.stdout.strip().splitlines()[-1]).values()
    print({"data_bytes": data_bytes, "small": small, "large": big})
    assert (small["rows"], big["rows"]) == (3_000, 300_000) and data_bytes > 150e6
    assert big["arrow_peak"] < data_bytes / 10  # bounded by a row group of the widest columns, not the corpus
    assert big["python_peak"] < data_bytes / 10
    assert big["python_peak"] - small["python_peak"] < 100 * (300_000 - 3_000)  # a few numbers per sentence
    assert big["rss_growth"] < data_bytes / 2  # allocator slack included; holding the data would add all of it
