"""The nightly audit as a series, on real chains: 41 nights through `dscore audit --history` with Sapiens VH,
injected events each judged as expected; and the rules' false-alarm rates on 200 quiet nights resampled
from one scored corpus.

Sapiens VH (0.57 M parameters) rather than AntiBERTy (25.8 M) for the same reason as test_audit_snapshot.py:
41 nights of 250 chains are about 5 s a night here, against minutes with AntiBERTy. The figures this test
prints (`-s`) are the ones docs/audit.md quotes.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.workflows.audit.figures import LogBins
from distributed_scoring.workflows.audit.history import CANARY, History, figures_of_rows
from distributed_scoring.workflows.audit.series import Night, SeriesRules, judge_scope
from distributed_scoring.workflows.audit.verdicts import Thresholds

from helpers.series import Plan, audit_json, chains, night_label, pool_scores, write_night

QUIET = [*range(1, 9), *range(10, 17), 18, *range(19, 23)]
STEADY = [29, 30, 31]  # the base rows unchurned before the creep, so that each night's baseline pairs up
SPIKE, VANISH, RETURN = 9, 17, 18
TAIL = range(23, 29)  # steps 1..6
CREEP = range(32, 39)  # steps 1..7
NEW_MODEL, AFTER_NEW_MODEL, CANARY_MOVED = 39, 40, 41


@pytest.fixture(scope="module")
def scored_plan(offline_model_dir, tmp_path_factory):
    model = str(offline_model_dir("sapiens-vh"))
    plan = Plan(chains("human"), chains("mouse"))
    plan.nll = pool_scores(model, plan.texts(), tmp_path_factory.mktemp("pool"))
    return model, plan


def _night_parts(plan: Plan, k: int) -> dict[str, list[str]]:
    if k == SPIKE:
        return plan.spike(k)
    if k == VANISH:
        return plan.vanished(k)
    if k in TAIL:
        return plan.tail(k, k - TAIL.start + 1)
    if k in CREEP:
        return plan.creep(k, k - CREEP.start + 1)
    if k in STEADY:
        return plan.steady()
    return plan.quiet(k)


@pytest.mark.weights
def test_a_simulated_series_of_41_nights(scored_plan, offline_model_dir, tmp_path, capsys):
    model, plan = scored_plan
    other_model = str(offline_model_dir("sapiens-vl"))
    hist = tmp_path / "hist"
    canary = tmp_path / "canary.txt"
    canary.write_text("\n".join(plan.human_spare[:5]) + "\n")
    results: dict[int, dict] = {}
    for k in range(1, CANARY_MOVED + 1):
        if k == CANARY_MOVED:  # the last night's canary as an earlier scorer left it: 0.01 nats a token away
            _shift_canary(History(str(hist)), night_label(k - 1), 0.01)
        paths = write_night(tmp_path / f"snap{k}", _night_parts(plan, k))
        out = tmp_path / f"out{k}"
        argv = ["audit", *paths, "--output", str(out), "--history", str(hist), "--night", night_label(k)]
        argv += ["--model", other_model if k >= NEW_MODEL else model, "--canary", str(canary)]
        if k in CREEP:
            argv += ["--baseline", str(tmp_path / f"out{k - 1}")]
        rc = main(argv)
        capsys.readouterr()
        audit = audit_json(out)
        results[k] = {"rc": rc, "audit": audit, "series": audit["series"]}
    table = {k: _summary(r) for k, r in results.items()}
    with capsys.disabled():
        print("\n" + json.dumps(table, indent=1))

    for k in [*QUIET, *STEADY]:
        assert results[k]["rc"] == 0, (k, table[k])
        assert not results[k]["series"]["flagged"], (k, table[k])
    # A one-night spike: a regression that night only; the nights after it pass.
    assert results[SPIKE]["rc"] == 3 and "rolling" in results[SPIKE]["series"]["flagged"]["human.txt"]
    assert all(results[k]["rc"] == 0 for k in range(SPIKE + 1, SPIKE + 8))
    # A partition that vanishes and returns: reported both nights.
    assert {"night": night_label(VANISH), "scope": "human_b.txt", "event": "vanished"} in results[VANISH]["series"][
        "events"
    ]
    assert {"night": night_label(RETURN), "scope": "human_b.txt", "event": "returned"} in results[RETURN]["series"][
        "events"
    ]
    # A growing tail with flat PPPL: shape flags it; the PPPL stays within 1 % of the partition's base level.
    pppl = {k: results[k]["audit"]["partitions"]["mouse.txt"]["pppl_token"] for k in TAIL}
    assert all(abs(pppl[k] / plan.base_pppl("mouse") - 1) < 0.01 for k in TAIL), (pppl, plan.base_pppl("mouse"))
    assert "shape" in results[TAIL[-1]]["series"]["flagged"]["mouse.txt"]
    assert all("rolling" not in results[k]["series"]["flagged"].get("mouse.txt", []) for k in TAIL)
    # A creep of about 1.5 % a night: the baseline alone passes every night, drift flags it within 7 nights.
    assert all(results[k]["audit"]["baseline"]["verdict"] == "pass" for k in CREEP)
    steps = [results[k]["audit"]["partitions"]["mouse.txt"]["pppl_token"] for k in [CREEP.start - 1, *CREEP]]
    assert all(0 < b / a - 1 < 0.05 for a, b in zip(steps, steps[1:])), steps
    assert any("drift" in results[k]["series"]["flagged"].get("mouse.txt", []) for k in CREEP)
    # A model change: a new segment, exit 4, no data verdict across it; the next night has too few nights.
    changed = results[NEW_MODEL]["series"]
    assert results[NEW_MODEL]["rc"] == 4 and changed["verdict"] == "scorer changed"
    assert changed["segment"] == night_label(NEW_MODEL) and not changed["flagged"]
    assert results[AFTER_NEW_MODEL]["rc"] == 0
    assert results[AFTER_NEW_MODEL]["series"]["verdict"] == "insufficient history"
    # The canary moved while the data and the scorer's identity did not: the scorer changed.
    moved = results[CANARY_MOVED]["series"]
    assert results[CANARY_MOVED]["rc"] == 4 and "canary moved" in moved["scorer_changed"]

    history = pq.read_table(hist).to_pandas()  # as a user reads it: one table, the night a column
    assert history.groupby(["night", "scope"]).size().max() == 1
    assert set(history["night"]) == {night_label(k) for k in results}
    assert main(["history", str(hist), "--trend", str(tmp_path / "trend.html")]) == 0


def _shift_canary(history: History, night: str, nats_per_token: float) -> None:
    table = history.read(night)
    rows = table.to_pylist()
    for row in rows:
        if row["scope"] == CANARY:
            row["canary_pll"] = [p - nats_per_token * n for p, n in zip(row["canary_pll"], row["canary_tokens"])]
    history.append(night, pa.Table.from_pylist(rows, schema=table.schema))


def _summary(result: dict) -> dict:
    series = result["series"]
    return {
        "rc": result["rc"],
        "verdict": series["verdict"],
        "flagged": series["flagged"],
        "events": [f"{e['scope']} {e['event']}" for e in series["events"]],
        "pppl": {s: round(v["pppl_token"], 3) for s, v in result["audit"]["partitions"].items()},
    }


@pytest.mark.weights
def test_false_alarms_on_200_quiet_nights(scored_plan):
    """Nights resampled (with replacement) from one scored corpus: the share of nights each rule flags, per
    scope and at the defaults, must stay under 2 %."""
    _, plan = scored_plan
    pools = {
        "human": np.array([plan.nll[t] for t in plan.human_base]),
        "mouse": np.array([plan.nll[t] for t in plan.mouse_base]),
    }
    t, rules, bins = Thresholds(), SeriesRules(), LogBins()
    rng = np.random.default_rng(1)
    flagged = {rule: 0 for rule in ("rolling", "drift", "shape")}
    judged = 0
    history: dict[str, list[Night]] = {name: [] for name in pools}
    for night in range(200):
        for name, pool in pools.items():
            per_token = rng.choice(pool, pool.size)
            tokens = np.full(pool.size, 30.0)
            _, extra = figures_of_rows(per_token * tokens, tokens, tokens, "pppl_token")
            counts = np.bincount(np.searchsorted(bins.log_edges(), per_token, side="right"), minlength=bins.bins + 2)
            tonight = Night(
                str(night),
                pool.size,
                0,
                float(per_token.mean()),
                extra["log_pppl_se"],
                extra["nll_q10"],
                extra["nll_q90"],
                tuple(counts.tolist()),
            )
            scope = judge_scope(name, tonight, per_token, history[name][-rules.window :], t, rules)
            if night >= rules.window:
                judged += 1
                for rule in scope.flagged:
                    flagged[rule] += 1
            history[name].append(tonight)
    rates = {rule: n / judged for rule, n in flagged.items()}
    print(f"\nfalse alarms on {judged} quiet scope-nights: {rates}")
    assert all(rate <= 0.02 for rate in rates.values()), rates
