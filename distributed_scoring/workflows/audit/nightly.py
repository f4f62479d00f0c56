"""Tonight's audit as a night of the series: its segment, its verdicts against the nights before it, and the
rows it adds to the history (`history.py` keeps them, `series.py` judges).

A night continues the previous night's segment when the scorer is the same: the same identity (the summary's
signature without package versions, plus the weights' digest) and, with a canary, the canary's PLLs within
float noise of the previous night's. Otherwise it starts a new segment (`scorer changed`, exit 4) and no data
verdict is read across the change: the reference of a night is the last `window` nights of its segment.

The same reference nights give tonight's outlier cutoffs (`series_cutoffs`), so the night is placed in its
history (`open_night`) before the outlier rule runs, and judged (`audit_night`) once its figures exist.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...io import schema as S
from ...io.output import OutputDir
from ...versions import versions
from .history import CANARY, HISTORY_SCHEMA, History, figures_of_rows, scope_night, signature_json
from .outliers import SERIES, Cutoff, OutlierRule, reference_cutoff
from .row_stats import OK_COLUMN
from .series import INSUFFICIENT_HISTORY, Night, Rule, ScopeSeries, SeriesRules, judge_scope
from .verdicts import EXIT_INSUFFICIENT, EXIT_OK, EXIT_REGRESSION, INSUFFICIENT, OVERALL, REGRESSION, Thresholds

__all__ = [
    "EXIT_SCORER_CHANGED",
    "Canary",
    "OpenNight",
    "Segment",
    "SeriesInputs",
    "SeriesRecord",
    "Tonight",
    "audit_night",
    "combined_exit",
    "judge_night",
    "open_night",
    "place_night",
    "scorer_identity",
    "series_cutoffs",
]

logger = logging.getLogger(__name__)

CANARY_DIR = "canary"  # the canary's own scoring run, inside the audit's folder
EXIT_SCORER_CHANGED = 4  # the scorer moved tonight: a new segment, no data verdict (as `incomparable`)
SCORER_CHANGED = "scorer changed"
NEW, VANISHED, RETURNED = "new", "vanished", "returned"


@dataclass(frozen=True)
class SeriesInputs:
    """`dscore audit --history`: where the series is kept, tonight's label, how it judges, and what the run
    adds: the canary run's folder, the model files' digest, the snapshot's fingerprint."""

    history: str
    night: str | None = None  # None: the UTC date of the run
    rules: SeriesRules = SeriesRules()
    canary: str | None = None  # the canary's file
    canary_rows: str | None = None  # the folder of its scored rows
    weights: str | None = None  # `engine.model_files.files_digest`
    input_fingerprint: str | None = None


@dataclass(frozen=True)
class Segment:
    """Where a night falls in its history: the previous night's rows (`last`; empty on the first night), why
    the scorer changed since (None: it did not), the night's segment, and its reference nights (the rows of
    the segment's last `window` nights before it, oldest first; none after a change)."""

    last: list[dict]
    changed: str | None
    segment: str
    reference: list[list[dict]]


@dataclass(frozen=True)
class OpenNight:
    """Tonight placed in its history before its figures exist: the outlier rule needs its reference nights
    (`series_cutoffs`) before the figures that `audit_night` judges are made."""

    inputs: SeriesInputs
    identity: dict
    canary: Canary | None
    segment: Segment


def open_night(inputs: SeriesInputs, signature: dict | list | None) -> OpenNight:
    """Tonight's scorer, canary and place in the history (read, not yet written)."""
    canary = None
    if inputs.canary_rows is not None:
        canary = Canary.of_rows(OutputDir(inputs.canary_rows).read_rows([S.ID, S.STATUS, S.PLL, S.N_TOKENS]))
    identity = scorer_identity(signature, inputs.weights)
    segment = place_night(History(inputs.history), inputs.night, identity, canary, inputs.rules)
    return OpenNight(inputs, identity, canary, segment)


def audit_night(night: OpenNight, figures: dict, histograms: dict, rows: pa.Table, t: Thresholds) -> SeriesRecord:
    """Judge tonight against the history and append it (replacing an earlier write of the same night)."""
    inputs = night.inputs
    tonight = Tonight(inputs.night, figures, histograms, rows, night.identity, inputs.input_fingerprint, night.canary)
    history = History(inputs.history)
    record, table = judge_night(history, tonight, t, inputs.rules, night.segment)
    history.append(inputs.night, table)
    return record


def series_cutoffs(segment: Segment, rule: OutlierRule) -> dict[str, Cutoff]:
    """Each scope's outlier cutoff from the reference nights, by scope name: the median over those nights of
    each night's own median of NLL per token, and likewise of its measured sigma, under tonight's rule.

    Medians over nights, not a pooled fit: the history keeps each night's figures, not its rows, and a
    median lets up to half the reference nights be contaminated themselves without moving the cutoff, as the
    rolling rule's median of the window does. The median of sigmas is the typical spread within one night
    (the rule judges rows within a night; how nights move against each other is the rolling and drift
    rules'). A scope no reference night has both figures for (a new partition, nights recorded before the
    history kept them) is absent: tonight's own rows judge it. One night is enough, as one baseline is.
    """
    figures: dict[str, list[tuple[str, float, float]]] = {}
    for rows in segment.reference:
        for row in rows:
            median, sigma = row.get("outlier_median"), row.get("outlier_sigma")
            if median is not None and sigma is not None:
                figures.setdefault(row["scope"], []).append((row["night"], median, sigma))
    return {
        scope: reference_cutoff(
            float(np.median([m for _, m, _ in found])),
            float(np.median([s for _, _, s in found])),
            rule,
            SERIES,
            [night for night, _, _ in found],
        )
        for scope, found in figures.items()
    }


def combined_exit(baseline: int, series: "SeriesRecord | None") -> int:
    """The audit's exit code from the baseline's and the series': a regression of either first, then a scorer
    change, then the baseline's own (insufficient data, incomparable), then the series'."""
    code = series.exit_code if series is not None else EXIT_OK
    if EXIT_REGRESSION in (baseline, code):
        return EXIT_REGRESSION
    if code == EXIT_SCORER_CHANGED:
        return EXIT_SCORER_CHANGED
    return baseline or code


def scorer_identity(signature: dict | list | None, weights: str | None) -> dict:
    """What the scorer is, for the series: the rows' signature less package versions (a new dscore or torch
    that scores alike continues the series; one that does not moves the canary), plus the digest of the model
    folder's files (weights, configuration, tokenizer)."""
    drop = set(versions())
    signatures = signature if isinstance(signature, list) else [signature or {}]
    kept = [{k: v for k, v in sorted(s.items()) if k not in drop} for s in signatures]
    return {"signature": kept[0] if len(kept) == 1 else kept, "weights_digest": weights}


def _digest(identity: dict) -> str:
    return hashlib.sha256(signature_json(identity).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Canary:
    """The canary's rows tonight, by id: its PLLs (NaN for an error row) and tokens."""

    ids: list[str]
    pll: list[float]
    tokens: list[int]

    @classmethod
    def of_rows(cls, rows: pa.Table) -> "Canary":
        rows = rows.sort_by(S.ID)
        ok = pc.equal(rows[S.STATUS], S.STATUS_OK).to_numpy(zero_copy_only=False)
        pll = rows[S.PLL].to_numpy(zero_copy_only=False).astype(np.float64)
        return cls(
            rows[S.ID].cast(pa.string()).to_pylist(),
            np.where(ok, pll, np.nan).tolist(),
            pc.fill_null(rows[S.N_TOKENS], 0).to_pylist(),
        )

    def moved(self, before: dict, tolerance: float) -> str | None:
        """Why tonight's canary is not last night's within `tolerance` nats per token, or None."""
        if before.get("canary_ids") is None:
            return None
        if list(before["canary_ids"]) != self.ids:
            logger.warning("the canary's texts differ from last night's: it is compared from tonight on")
            return None
        was = np.array([math.nan if v is None else v for v in before["canary_pll"]], np.float64)
        now = np.array(self.pll)
        move = np.abs(now - was) / np.maximum(np.array(self.tokens, np.float64), 1.0)
        both = np.isfinite(move)
        if (np.isnan(now) != np.isnan(was)).any():
            return "a canary text scored last night fails tonight, or the other way round"
        worst = float(move[both].max()) if both.any() else 0.0
        if worst > tolerance:
            text = self.ids[int(np.nanargmax(np.where(both, move, -1)))]
            return f"the canary moved: {worst:.3g} nats per token on {text!r} (tolerance {tolerance:g})"
        return None


@dataclass(frozen=True)
class SeriesRecord:
    """audit.json's `series`: tonight in its history, each scope's verdicts, the night's events."""

    history: str
    night: str
    segment: str
    scorer: str
    rules: SeriesRules
    scopes: tuple[ScopeSeries, ...]
    events: tuple[dict, ...] = ()
    scorer_changed: str | None = None
    canary: dict | None = None
    methods: tuple[str, ...] = field(default=())

    @property
    def regressions(self) -> tuple[ScopeSeries, ...]:
        return tuple(s for s in self.scopes if s.flagged)

    @property
    def undecided(self) -> tuple[ScopeSeries, ...]:
        return tuple(s for s in self.scopes if s.status in (INSUFFICIENT, INSUFFICIENT_HISTORY))

    @property
    def exit_code(self) -> int:
        if self.regressions:
            return EXIT_REGRESSION
        if self.scorer_changed:
            return EXIT_SCORER_CHANGED
        return EXIT_INSUFFICIENT if self.undecided and self.rules.require_history else EXIT_OK

    @property
    def verdict(self) -> str:
        if self.regressions:
            return REGRESSION
        if self.scorer_changed:
            return SCORER_CHANGED
        overall = next((s for s in self.scopes if s.name == OVERALL), None)
        if overall is not None and overall.status == INSUFFICIENT_HISTORY:
            return INSUFFICIENT_HISTORY
        return INSUFFICIENT if self.undecided else "pass"

    def to_json(self) -> dict:
        return {
            "history": self.history,
            "night": self.night,
            "segment": self.segment,
            "scorer": self.scorer,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "scorer_changed": self.scorer_changed,
            "rules": asdict(self.rules),
            "methods": list(self.methods),
            "flagged": {s.name: list(s.flagged) for s in self.regressions},
            "events": list(self.events),
            "canary": self.canary,
            "scopes": {s.name: s.to_json() for s in self.scopes},
        }


METHODS = (
    "rolling: log PPPL against the median of the window's nights; sd from the larger of tonight's standard "
    "error and the nights' 1.4826 MAD, plus the median's (pi/2) sigma^2 / n; error rate: Newcombe against the "
    "median night",
    "drift: Theil-Sen slope of log PPPL over the window and tonight, Sen's rank interval, times the span",
    "shape: share of rows above the median of the reference nights' 90th percentiles, Wilson interval",
)


@dataclass(frozen=True)
class Tonight:
    """What the audit gives the series: its record's figures, its per-row figures, the scorer and canary."""

    night: str
    figures: dict  # scope -> ScopeFigures
    histograms: dict  # scope -> tuple of counts
    rows: pa.Table | None  # row_stats: id, partition, ok, pll, n_tokens, n_words (None: an audit without them)
    identity: dict
    input_fingerprint: str | None
    canary: Canary | None = None


def place_night(history: History, night: str, identity: dict, canary: Canary | None, rules: SeriesRules) -> Segment:
    """Where `night`, scored by `identity` (with `canary`), falls in `history`: its segment and reference."""
    earlier = history.before(night)
    last = history.read(earlier[-1]).to_pylist() if earlier else []
    changed = _scorer_change(last, _digest(identity), identity, canary, rules)
    segment = night if changed or not last else last[0]["segment"]
    reference = [] if changed or not last else _segment_nights(history, earlier, segment, rules.window, last)
    return Segment(last, changed, segment, reference)


def judge_night(
    history: History, tonight: Tonight, t: Thresholds, rules: SeriesRules, place: Segment | None = None
) -> tuple[SeriesRecord, pa.Table]:
    """Tonight against its history: the series' verdicts, and the rows to append (not yet appended). `place`:
    tonight's `place_night`, when the caller has it already."""
    scorer = _digest(tonight.identity)
    if place is None:
        place = place_night(history, tonight.night, tonight.identity, tonight.canary, rules)
    last, changed, segment, reference = place.last, place.changed, place.segment, place.reference
    per_scope = _rows_by_scope(tonight.rows, t.metric) if tonight.rows is not None else {}
    scopes = []
    for name in (OVERALL, *sorted(n for n in tonight.figures if n != OVERALL)):
        nll, extra = per_scope.get(name, (None, {}))
        night = _tonight_night(tonight, name, extra, t.metric)
        if changed:
            why = Rule(INSUFFICIENT_HISTORY, f"not judged: {changed}; tonight starts a new segment")
            scopes.append(ScopeSeries(name, 0, why, why, why))
            continue
        mine = [r for night_rows in reference for r in night_rows if r["scope"] == name and r["rows"]]
        judged = judge_scope(name, night, nll, [scope_night(r, t.metric) for r in mine], t, rules)
        recent = [(r["night"], r.get(t.metric), r.get("series_status")) for r in mine]
        tonight_point = (tonight.night, tonight.figures[name].figure(t.metric), judged.status)
        scopes.append(replace(judged, recent=(*recent, tonight_point)))
    events = _events(tonight, last, reference, changed)
    canary = None if tonight.canary is None else {"texts": len(tonight.canary.ids), "moved": changed}
    record = SeriesRecord(
        history.uri, tonight.night, segment, scorer, rules, tuple(scopes), events, changed, canary, METHODS
    )
    return record, _night_table(record, tonight, per_scope, t)


def _scorer_change(
    last: list[dict], scorer: str, identity: dict, canary: Canary | None, rules: SeriesRules
) -> str | None:
    if not last:
        return None
    if last[0]["scorer"] != scorer:
        keys = _changed_keys(json.loads(last[0]["scorer_signature"] or "{}"), identity)
        if keys:
            return f"{SCORER_CHANGED} since {last[0]['night']} ({', '.join(keys)})"
    if canary is None:
        return None
    canary_row = next((r for r in last if r["scope"] == CANARY), None)
    moved = canary.moved(canary_row, rules.canary_tolerance) if canary_row else None
    return f"{SCORER_CHANGED} since {last[0]['night']}: {moved}" if moved else None


def _changed_keys(before: dict, now: dict) -> list[str]:
    """What differs between two identities; a weights digest known on one side only (a night added from an
    earlier audit's folder, which recorded none) is no difference."""
    if not isinstance(before.get("signature"), dict) or not isinstance(now.get("signature"), dict):
        return [] if before.get("signature") == now.get("signature") else ["signature"]
    keys = sorted(
        k for k in {*before["signature"], *now["signature"]} if before["signature"].get(k) != now["signature"].get(k)
    )
    weights = before.get("weights_digest"), now.get("weights_digest")
    return keys + (["weights_digest"] if None not in weights and weights[0] != weights[1] else [])


def _segment_nights(
    history: History, earlier: list[str], segment: str, window: int, last: list[dict]
) -> list[list[dict]]:
    """The last `window` nights of `segment` before tonight, oldest first (the last one already read)."""
    nights = [last]
    for night in reversed(earlier[:-1]):
        if len(nights) >= window:
            break
        rows = history.read(night).to_pylist()
        if not rows or rows[0]["segment"] != segment:
            break
        nights.append(rows)
    return nights[::-1]


def _rows_by_scope(rows: pa.Table, metric: str) -> dict[str, tuple[np.ndarray, dict]]:
    """Per scope (the corpus and each partition): its ok rows' NLL per token, and their quantiles and the
    standard error of log PPPL."""
    ok = pc.fill_null(rows[OK_COLUMN], False).to_numpy(zero_copy_only=False)
    nll = -pc.fill_null(rows[S.PLL], 0.0).to_numpy(zero_copy_only=False).astype(np.float64)[ok]
    tokens = rows[S.N_TOKENS].to_numpy(zero_copy_only=False).astype(np.float64)[ok]
    words = rows[S.N_WORDS].to_numpy(zero_copy_only=False).astype(np.float64)[ok]
    names = rows[S.PARTITION].filter(pa.array(ok)).combine_chunks().dictionary_encode()
    codes = names.indices.to_numpy(zero_copy_only=False)
    out = {OVERALL: figures_of_rows(nll, tokens, words, metric)}
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names.dictionary) + 1))
    for i, name in enumerate(names.dictionary.to_pylist()):
        take = order[bounds[i] : bounds[i + 1]]
        out[name] = figures_of_rows(nll[take], tokens[take], words[take], metric)
    return out


def _tonight_night(tonight: Tonight, name: str, extra: dict, metric: str) -> Night:
    f = tonight.figures[name]
    pppl = f.figure(metric)
    return Night(
        tonight.night,
        f.rows,
        f.errors,
        math.log(pppl) if pppl else None,
        extra.get("log_pppl_se"),
        extra.get("nll_q10"),
        extra.get("nll_q90"),
        tonight.histograms.get(name, ()),
    )


def _events(tonight: Tonight, last: list[dict], reference: list[list[dict]], changed: str | None) -> tuple[dict, ...]:
    """Partitions that appeared, vanished or came back since the previous night, and a scorer change."""
    events = [{"night": tonight.night, "scope": OVERALL, "event": SCORER_CHANGED, "why": changed}] if changed else []
    if not last:
        return tuple(events)
    present = {n for n in tonight.figures if n != OVERALL}
    before = {r["scope"] for r in last if r["rows"] and r["scope"] not in (OVERALL, CANARY)}
    seen = {r["scope"] for night in reference for r in night if r["rows"]}
    for name in sorted(present - before):
        events.append({"night": tonight.night, "scope": name, "event": RETURNED if name in seen else NEW})
    for name in sorted(before - present):
        events.append({"night": tonight.night, "scope": name, "event": VANISHED})
    return tuple(events)


def _night_table(record: SeriesRecord, tonight: Tonight, per_scope: dict, t: Thresholds) -> pa.Table:
    """The night's rows for the history: a row per scope, one per vanished partition, the canary's."""
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    common = {
        "night": tonight.night,
        "created": created,
        "segment": record.segment,
        "scorer": record.scorer,
        "scorer_signature": signature_json(tonight.identity),
        "input_fingerprint": tonight.input_fingerprint,
        "metric": t.metric,
        "pppl_band": t.max_pppl_increase,
        "verdict": record.verdict,
        "exit_code": record.exit_code,
    }
    event_of = {e["scope"]: e["event"] for e in record.events}
    rows = []
    for scope in record.scopes:
        f = tonight.figures[scope.name]
        rows.append(
            {
                **common,
                **{k: v for k, v in asdict(f).items() if k in HISTORY_SCHEMA.names},
                **per_scope.get(scope.name, (None, {}))[1],
                "scope": scope.name,
                "event": event_of.get(scope.name),
                "histogram": list(tonight.histograms.get(scope.name, ())),
                **{name: rule.status for name, rule in scope.rules()},
                "series_status": scope.status,
                "reference_pppl": scope.rolling.reference,
                "rolling_ratio": scope.rolling.estimate,
                "tail_share": scope.shape.estimate,
                "head_share": scope.head_share,
                "psi": scope.psi,
            }
        )
    for e in record.events:
        if e["event"] == VANISHED:
            rows.append({**common, "scope": e["scope"], "event": VANISHED, "rows": 0})
    if tonight.canary is not None:
        rows.append(_canary_row(common, tonight.canary, record.scorer_changed))
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def _canary_row(common: dict, canary: Canary, changed: str | None) -> dict:
    pll = np.array(canary.pll)
    tokens = np.array(canary.tokens, np.float64)
    ok = np.isfinite(pll)
    total = float(tokens[ok].sum())
    return {
        **common,
        "scope": CANARY,
        "event": SCORER_CHANGED if changed else None,
        "rows": len(canary.ids),
        "ok": int(ok.sum()),
        "errors": int((~ok).sum()),
        "sum_pll": float(pll[ok].sum()),
        "n_tokens": int(total),
        "pppl_token": math.exp(-float(pll[ok].sum()) / total) if total else None,
        "canary_ids": canary.ids,
        "canary_pll": [None if not math.isfinite(v) else v for v in canary.pll],
        "canary_tokens": canary.tokens,
    }
