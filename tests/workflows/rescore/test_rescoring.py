"""N-best rescoring: known answers, the tie rule, the vectorised search against a brute-force search that
calls jiwer/sacrebleu at every grid point, length penalties, outputs and refusals."""

from __future__ import annotations

import json
import math
import random

import jiwer
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sacrebleu

from distributed_scoring.errors import UserError
from distributed_scoring.io import nbest
from distributed_scoring.io import schema as S
from distributed_scoring.io.claim import claim
from distributed_scoring.workflows.rescore import outputs as O
from distributed_scoring.workflows.rescore.combine import TextScore, text_scores
from distributed_scoring.workflows.rescore.metrics import BleuStats, WerStats
from distributed_scoring.workflows.rescore.rescoring import rescore
from distributed_scoring.workflows.rescore.search import BLEU_ALPHAS, RescoreOptions

from helpers import rescoring as H
from helpers.reference import corpus_metric, rescore_brute_force

NO_PENALTY = dict(mlm_alpha=0.0, causal_alpha=0.0)


def oracle_lm(lm: dict[str, float]) -> dict[str, TextScore]:
    return {text: TextScore(score, len(text.split())) for text, score in lm.items()}


def known_answer_lists(seed: int = 0):
    dev, lm_dev = H.synthetic_nbest(30, 6, seed, prefix="dev")
    test, lm_test = H.synthetic_nbest(30, 6, seed + 1, prefix="test")
    return nbest.nbest_table(dev), nbest.nbest_table(test), oracle_lm({**lm_dev, **lm_test})


@pytest.mark.parametrize("which", ["mlm", "causal"])
def test_rescoring_finds_the_known_best_hypothesis(which):
    dev, test, lm = known_answer_lists()
    result = rescore(dev, test, **{which: lm}, options=RescoreOptions(**NO_PENALTY))
    for split in ("dev", "test"):
        figures = result.report[split]
        assert figures["baseline"] > 0.1, "the sequence model alone should often be wrong"
        assert figures["rescored"] == figures["oracle"] == 0.0
        assert figures["changed"] > 5
    best = result.best.to_pylist()
    assert len(best) == 60 and all(b["text"] == b["ref"] for b in best)
    assert result.gamma == (1.0 if which == "mlm" else 0.0)
    # Every lambda large enough is perfect here, so the tie rule picks the top of the grid.
    assert result.lam == 1.0


# Two utterances whose best hypothesis needs 1/3 < lambda (u1) and lambda < 0.5167 (u2), with LM scores.
TIE_RECORDS = [
    dict(utt_id="u1", hyp_id=1, text="b", score=1.0, ref="a"),
    dict(utt_id="u1", hyp_id=2, text="a", score=0.0, ref="a"),
    dict(utt_id="u2", hyp_id=1, text="c", score=0.0, ref="c"),
    dict(utt_id="u2", hyp_id=2, text="d", score=-3.1, ref="c"),
]
TIE_SCORES = {"a": TextScore(-10.0, 1), "b": TextScore(-13.0, 1), "c": TextScore(-10.0, 1), "d": TextScore(-4.0, 1)}


def test_ties_go_to_the_largest_lambda():
    """Utterance 1 needs lambda > 1/3, utterance 2 needs lambda < 0.5167: the optimal grid points are
    0.35 ... 0.5 and the rule picks 0.5 (the first optimum would be 0.35)."""
    table = nbest.nbest_table(TIE_RECORDS)
    result = rescore(table, table, mlm=TIE_SCORES, options=RescoreOptions(**NO_PENALTY))
    grid = np.array(result.report["grid"]["dev"][0][0])  # (alpha 0, gamma 1): one row of lambdas
    lambdas = np.array(result.report["grid"]["lambda"])
    assert lambdas[grid == 0].tolist() == [0.35, 0.4, 0.45, 0.5]
    assert result.lam == 0.5
    assert result.report["dev"]["rescored"] == 0.0


def test_ties_go_to_the_largest_lambda_before_the_largest_gamma():
    """Only the masked LM tells the hypotheses apart (the causal LM scores them all alike), so the
    optimum is 1/3 < lambda * gamma < 0.5167: lambda = 1 with gamma 0.4 or 0.5, ..., up to gamma = 1
    with lambda 0.35 ... 0.5. Largest lambda first gives (1.0, 0.5); largest gamma first would give (0.5, 1.0)."""
    causal = {t: TextScore(-10.0, 1) for t in TIE_SCORES}
    table = nbest.nbest_table(TIE_RECORDS)
    result = rescore(table, table, mlm=TIE_SCORES, causal=causal, options=RescoreOptions(**NO_PENALTY))
    grid = np.array(result.report["grid"]["dev"][0])  # (gamma, lambda) at the one alpha searched
    assert grid[10, 7] == 0.0 and grid[10, 11] > 0  # (gamma 1, lambda 0.35) optimal, (gamma 1, lambda 0.55) not
    assert (result.lam, result.gamma) == (1.0, 0.5)


def test_equal_totals_within_an_utterance_go_to_the_better_rank():
    records = [
        dict(utt_id="u", hyp_id=h, text=t, score=-1.0, ref="x y") for h, t in ((2, "x z"), (1, "x y"), (3, "x w"))
    ]
    lm = {t: TextScore(-5.0, 2) for t in ("x y", "x z", "x w")}
    table = nbest.nbest_table(records)
    result = rescore(table, table, mlm=lm)
    assert result.best.column("hyp_id").to_pylist() == [1, 1]
    ranks = result.hypotheses.filter(pa.compute.equal(result.hypotheses["split"], "dev"))
    assert ranks.column(O.RESCORED_RANK).to_pylist() == [1, 2, 3]


# Against the brute-force reference (reference.rescore_brute_force): every grid point scored by its own
# loop and a jiwer/sacrebleu call.


def random_lists(seed: int, n_utts: int, words: list[str]) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for u in range(n_utts):
        ref = " ".join(rng.choice(words) for _ in range(rng.randint(2, 6)))
        texts = {" ".join(rng.choice(words) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(1, 5))}
        for rank, text in enumerate(sorted(texts), start=1):
            records.append(dict(utt_id=f"s{seed}-{u}", hyp_id=rank, text=text, score=rng.gauss(-5, 2), ref=ref))
    return records


def random_scores(records: list[dict], seed: int) -> dict[str, TextScore]:
    rng = random.Random(seed)
    return {
        r["text"]: TextScore(rng.gauss(-20, 6), rng.randint(1, 12)) for r in sorted(records, key=lambda r: r["text"])
    }


@pytest.mark.parametrize(
    "metric, tokenize, lms",
    [
        ("wer", "13a", ("mlm", "causal")),
        ("wer", "13a", ("mlm",)),
        ("bleu", "none", ("mlm", "causal")),
        ("bleu", "13a", ("causal",)),
    ],
)
def test_vectorised_search_equals_brute_force_with_jiwer_and_sacrebleu(metric, tokenize, lms):
    words = "the cat sat on a mat , . dog ran".split()
    dev_records, test_records = random_lists(1, 25, words), random_lists(2, 25, words)
    everything = dev_records + test_records
    scores = {"mlm": random_scores(everything, 3), "causal": random_scores(everything, 4)}
    given = {name: scores[name] for name in lms}
    options = RescoreOptions(
        metric=metric, bleu_tokenize=tokenize, mlm_alpha=1.0, causal_alpha=0.6, seq_alpha=0.6, lambda_limit=1.0
    )  # the grid itself; the extension is tested below
    result = rescore(nbest.nbest_table(dev_records), nbest.nbest_table(test_records), **given, options=options)
    mlm, causal = given.get("mlm"), given.get("causal")

    lambdas = result.report["grid"]["lambda"]
    assert lambdas == [round(i * 0.05, 10) for i in range(21)]
    gammas = [round(i * 0.1, 10) for i in range(11)] if len(lms) == 2 else [1.0 if "mlm" in lms else 0.0]
    reference_grid = [
        [corpus_metric(options, *rescore_brute_force(dev_records, mlm, causal, options, lam, g)) for lam in lambdas]
        for g in gammas
    ]
    assert result.report["grid"]["alpha"] == [[1.0, 0.6]]  # both exponents given: nothing to search
    np.testing.assert_allclose(result.report["grid"]["dev"][0], reference_grid, rtol=0, atol=1e-9)
    sign = 1 if metric == "bleu" else -1
    best = max(sign * v for row in reference_grid for v in row)
    ties = [(lam, g) for g, row in zip(gammas, reference_grid) for lam, v in zip(lambdas, row) if sign * v == best]
    assert (result.lam, result.gamma) == max(ties)
    assert len({v for row in reference_grid for v in row}) > 3, "the grid should not be flat"

    for split, records in (("dev", dev_records), ("test", test_records)):
        refs, chosen = rescore_brute_force(records, mlm, causal, options, result.lam, result.gamma)
        best_rows = result.best.filter(pa.compute.equal(result.best["split"], split))
        assert best_rows.column("text").to_pylist() == chosen
        assert result.report[split]["rescored"] == pytest.approx(corpus_metric(options, refs, chosen), abs=1e-12)
        _, baseline = rescore_brute_force(records, mlm, causal, options, 0.0, result.gamma)
        assert result.report[split]["baseline"] == pytest.approx(corpus_metric(options, refs, baseline), abs=1e-12)


def test_oracle_is_the_per_utterance_best_and_bounds_wer():
    words = "a b c d e".split()
    dev_records, test_records = random_lists(5, 40, words), random_lists(6, 40, words)
    scores = random_scores(dev_records + test_records, 7)
    result = rescore(nbest.nbest_table(dev_records), nbest.nbest_table(test_records), mlm=scores)
    for split, records in (("dev", dev_records), ("test", test_records)):
        by_utt: dict[str, list[dict]] = {}
        for r in records:
            by_utt.setdefault(r["utt_id"], []).append(r)
        refs = [hyps[0]["ref"] for hyps in by_utt.values()]
        oracle = [
            min(hyps, key=lambda h: (jiwer.process_words(h["ref"], h["text"]).wer, h["hyp_id"]))["text"]
            for hyps in by_utt.values()
        ]
        figures = result.report[split]
        assert figures["oracle"] == pytest.approx(jiwer.wer(refs, oracle), abs=1e-12)
        assert figures["oracle"] <= min(figures["baseline"], figures["rescored"])


def test_bleu_statistics_sum_to_sacrebleus_corpus_figure():
    """The per-hypothesis BLEU statistics summed over any selection give sacrebleu's own corpus BLEU."""
    rng = random.Random(0)
    words = "Hello , world ! it 's a test of the BLEU metric . ( yes )".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(40)]
    hyps = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(40)]
    for tokenize in ("13a", "none", "intl"):
        metric = BleuStats(tokenize, lowercase=False)
        stats = metric.statistics(refs, hyps)
        for pick in (slice(None), slice(0, 7), slice(10, 40, 3)):
            expected = sacrebleu.corpus_bleu(hyps[pick], [refs[pick]], tokenize=tokenize).score
            assert metric.corpus(stats[pick].sum(axis=0)) == pytest.approx(expected, abs=1e-9)
        for i in range(5):
            expected = sacrebleu.sentence_bleu(hyps[i], [refs[i]], tokenize=tokenize).score
            assert metric.sentence(stats[i : i + 1])[0] == pytest.approx(expected, abs=1e-9)


def test_wer_statistics_sum_to_jiwers_corpus_figure():
    rng = random.Random(1)
    words = "a b c d".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(50)]
    hyps = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(50)]
    refs[0] = "a  b   c "
    stats = WerStats().statistics(refs, hyps)
    assert WerStats().corpus(stats.sum(axis=0)) == pytest.approx(jiwer.wer(refs, hyps), abs=1e-12)
    assert WerStats().corpus(stats[5:20].sum(axis=0)) == pytest.approx(jiwer.wer(refs[5:20], hyps[5:20]), abs=1e-12)


def test_wer_statistics_are_jiwers_counts_per_hypothesis():
    """Each hypothesis's edits and reference words are jiwer's own (S + D + I and its word count), spaces,
    tabs, empty and non-ASCII texts included: the C distance must count what jiwer's alignment counts."""
    rng = random.Random(2)
    words = ["a", "b", "é", "ß", "a\tb", "c"]
    seps = [" ", "  ", "\t ", " \n "]

    def text() -> str:
        return rng.choice(["", " "]) + "".join(rng.choice(words) + rng.choice(seps) for _ in range(rng.randint(0, 9)))

    refs, hyps = [text() for _ in range(300)], [text() for _ in range(300)]
    stats = WerStats().statistics(refs, hyps)
    for row, (ref, hyp) in enumerate(zip(refs, hyps)):
        out = jiwer.process_words(ref, hyp)
        assert stats[row].tolist() == [out.substitutions + out.deletions + out.insertions, len(out.references[0])]
    assert WerStats().statistics([], []).shape == (0, 2)


def test_length_penalties_and_component_columns():
    """With alpha = 1 the MLM score is per-token-like, so a long fluent hypothesis beats a short one
    whose raw PLL sum is higher; with alpha = 0 the short one wins."""
    records = [
        dict(utt_id="u", hyp_id=1, text="the cat", score=-1.0, ref="the cat sat on the mat"),
        dict(utt_id="u", hyp_id=2, text="the cat sat on the mat", score=-1.0, ref="the cat sat on the mat"),
    ]
    lm = {"the cat": TextScore(-8.0, 2), "the cat sat on the mat": TextScore(-12.0, 6)}
    table = nbest.nbest_table(records)
    penalised = rescore(table, table, mlm=lm, options=RescoreOptions(mlm_alpha=1.0))
    plain = rescore(table, table, mlm=lm, options=RescoreOptions(mlm_alpha=0.0))
    assert penalised.best["text"][0].as_py() == "the cat sat on the mat"
    assert plain.best["text"][0].as_py() == "the cat"
    rows = penalised.hypotheses.to_pylist()
    for row in rows:
        assert row[O.MLM_LP] == pytest.approx(((5 + row[O.MLM_TOKENS]) / 6) ** 1.0)
        assert row[O.LM_SCORE] == pytest.approx(row[O.PLL] / row[O.MLM_LP])
        assert row[O.TOTAL] == pytest.approx(row["score"] / row[O.SEQ_LP] + penalised.lam * row[O.LM_SCORE])
        assert row[O.CAUSAL_LOGP] is None and row[O.SEQ_LP] == 1.0


def test_sequence_score_normalisation_uses_seq_len_when_given():
    records = [
        dict(utt_id="u", hyp_id=1, text="a", score=-3.0, ref="a b c d", seq_len=1),
        dict(utt_id="u", hyp_id=2, text="a b c d", score=-5.0, ref="a b c d", seq_len=12),
    ]
    lm = {"a": TextScore(-1.0, 1), "a b c d": TextScore(-1.0, 4)}
    table = nbest.nbest_table(records)
    result = rescore(table, table, mlm=lm, options=RescoreOptions(seq_alpha=0.6))
    lp = result.hypotheses.column(O.SEQ_LP).to_pylist()[:2]
    assert lp == pytest.approx([1.0, (17 / 6) ** 0.6])
    assert result.report["seq_length"] == "seq_len column"
    assert result.report["dev"]["baseline"] == 0.0  # -5 / 1.866 > -3: normalisation flips the baseline
    mixed = nbest.nbest_table([records[0], {**records[1], "seq_len": None}])
    with pytest.raises(nbest.NBestError, match="`seq_len` is given for some"):
        rescore(mixed, mixed, mlm=lm, options=RescoreOptions(seq_alpha=0.6))


def test_write_outputs(tmp_path):
    dev, test, lm = known_answer_lists(3)
    causal = {t: TextScore(s.logprob * 0.5, s.n_tokens + 1) for t, s in lm.items()}
    result = rescore(dev, test, mlm=lm, causal=causal, options=RescoreOptions(**NO_PENALTY))
    with claim(str(tmp_path / "out")) as folder:
        written = O.write_outputs(result, folder)
    assert sorted(p.rsplit("/", 1)[1] for p in written) == sorted(
        [O.HYPOTHESES_FILE, O.BEST_FILE, "dev.best.txt", "test.best.txt", O.REPORT_JSON, O.REPORT_MD]
    )
    hypotheses = pq.read_table(tmp_path / "out" / O.HYPOTHESES_FILE)
    assert hypotheses.schema == O.HYPOTHESES_SCHEMA and hypotheses.num_rows == dev.num_rows + test.num_rows
    best = pq.read_table(tmp_path / "out" / O.BEST_FILE)
    assert best.schema == O.BEST_SCHEMA
    for split, table in (("dev", dev), ("test", test)):
        lines = (tmp_path / "out" / f"{split}.best.txt").read_text().splitlines()
        utts = list(dict.fromkeys(table.column("utt_id").to_pylist()))
        assert lines == [b["text"] for b in best.to_pylist() if b["split"] == split]
        assert [b["utt_id"] for b in best.to_pylist() if b["split"] == split] == utts
    report = json.loads((tmp_path / "out" / O.REPORT_JSON).read_text())
    assert report["lambda"] == result.lam and report["gamma"] == result.gamma
    for split in ("dev", "test"):
        assert {"baseline", "rescored", "oracle"} <= set(report[split])
    assert len(report["grid"]["gamma"]) == 11 and len(report["grid"]["dev"][0]) == 11
    assert len(report["grid"]["dev"][0][0]) == len(report["grid"]["lambda"]) >= 21
    markdown = (tmp_path / "out" / O.REPORT_MD).read_text()
    assert f"lambda = {result.lam:g}" in markdown and f"{100 * report['test']['baseline']:.2f}" in markdown


def test_refusals():
    dev, test, lm = known_answer_lists()
    with pytest.raises(UserError, match="at least one LM"):
        rescore(dev, test)
    partial = dict(list(lm.items())[:-3])
    with pytest.raises(UserError, match="3 hypothesis texts have no masked LM score"):
        rescore(dev, test, mlm=partial)
    no_ref = nbest.nbest_table([{**r, "ref": None} for r in dev.to_pylist()])
    with pytest.raises(nbest.NBestError, match="dev: 30 utterances have no reference"):
        rescore(no_ref, test, mlm=lm)
    with pytest.raises(UserError, match="metric 'cer'"):
        RescoreOptions(metric="cer")
    with pytest.raises(UserError, match="bleu_tokenize"):
        RescoreOptions(metric="bleu", bleu_tokenize="moses")
    with pytest.raises(UserError, match="lambda_step"):
        RescoreOptions(lambda_step=0)


def test_text_scores_from_scorer_tables():
    table = pa.table(
        {
            S.TEXT: ["a b", "c", "a b"],
            S.PLL: [-3.0, -1.0, -3.0],
            S.N_TOKENS: [2, 1, 2],
            S.STATUS: ["ok", "ok", "ok"],
            S.ERROR: [None, None, None],
        }
    )
    assert text_scores(table, S.PLL, "masked LM") == {"a b": TextScore(-3.0, 2), "c": TextScore(-1.0, 1)}
    failed = table.set_column(3, S.STATUS, pa.array(["ok", "error", "ok"]))
    failed = failed.set_column(4, S.ERROR, pa.array([None, "too long", None]))
    with pytest.raises(UserError, match="could not score 1 hypothesis texts \\('c': too long\\)"):
        text_scores(failed, S.PLL, "masked LM")


def test_scores_from_the_engines_drive_rescoring(tmp_path, tiny_model_dir):
    """The contract the pipeline follows: score `unique_texts` once per LM, turn the scorers' output
    tables into mappings with `text_scores`, and rescore; the component columns carry those scores."""
    from distributed_scoring.config import ModelSpec, ScoringOptions
    from distributed_scoring.engine.causal import CausalEngine, load_causal_lm
    from distributed_scoring.engine.model_files import load_tokenizer
    from distributed_scoring.io.schema import LOGP
    from distributed_scoring.workloads.causal import score_texts
    from distributed_scoring.workloads.pll import PLLScorer
    from distributed_scoring.workloads.prepare import PLLPreparer

    dev, test, _ = known_answer_lists(5)
    texts = nbest.unique_texts(dev, test)
    spec = ModelSpec(str(tiny_model_dir("bert")))
    read = pa.table(
        {
            S.ID: [f"h{i}" for i in range(len(texts))],
            S.TEXT: texts,
            S.STATUS: [S.STATUS_OK] * len(texts),
            S.ERROR: pa.nulls(len(texts), pa.string()),
        }
    )
    mlm_table = PLLScorer(spec, ScoringOptions())(PLLPreparer(*load_tokenizer(spec))(read))
    gpt2 = load_causal_lm(ModelSpec(str(H.save_tiny_causal("gpt2", tmp_path / "gpt2"))))
    causal_table = score_texts(CausalEngine(gpt2), texts)
    mlm, causal = text_scores(mlm_table, S.PLL, "masked LM"), text_scores(causal_table, LOGP, "causal LM")
    assert set(mlm) == set(causal) == set(texts)
    result = rescore(dev, test, mlm=mlm, causal=causal)
    for row in result.hypotheses.to_pylist():
        assert (row[O.PLL], row[O.MLM_TOKENS]) == tuple(mlm[row["text"]])
        assert (row[O.CAUSAL_LOGP], row[O.CAUSAL_TOKENS]) == tuple(causal[row["text"]])
    assert result.report["lms"] == {"mlm": True, "causal": True}


def test_antibody_nbest_helper():
    rng = random.Random(0)
    sequences = {f"vh{i}": "".join(rng.choice(H.AMINO_ACIDS) for _ in range(60)) for i in range(12)}
    table = H.antibody_nbest(sequences, n_best=6, seed=1)
    assert table.schema == nbest.NBEST_SCHEMA and table.num_rows == 72
    truth_ranks = [r["hyp_id"] for r in table.to_pylist() if r["text"] == r["ref"]]
    assert len(truth_ranks) == 12 and min(truth_ranks) == 1 and max(truth_ranks) > 1
    for r in table.to_pylist():
        residues = r["text"].split()
        assert len(residues) == len(r["ref"].split()) and set(residues) <= set(H.AMINO_ACIDS)
    assert math.isfinite(sum(table.column("score").to_pylist()))


# --- defaults and the edges of the search (issue: defaults did nothing, lambda stopped at 1.0) ----------


def two_thresholds(low: float, high: float) -> tuple[pa.Table, dict[str, TextScore]]:
    """Utterance u1 is right only for lambda > `low`, u2 only for lambda < `high` (LM gap of 1 nat each)."""
    records = [
        dict(utt_id="u1", hyp_id=1, text="b", score=0.0, ref="a"),
        dict(utt_id="u1", hyp_id=2, text="a", score=-low, ref="a"),
        dict(utt_id="u2", hyp_id=1, text="c", score=0.0, ref="c"),
        dict(utt_id="u2", hyp_id=2, text="d", score=-high, ref="c"),
    ]
    lm = {"a": TextScore(-1.0, 1), "b": TextScore(-2.0, 1), "c": TextScore(-2.0, 1), "d": TextScore(-1.0, 1)}
    return nbest.nbest_table(records), lm


def test_the_search_goes_past_lambda_one_when_the_optimum_lies_there():
    table, lm = two_thresholds(1.5, 2.5)
    result = rescore(table, table, mlm=lm)
    assert 1.5 < result.lam < 2.5, result.report["grid"]["lambda"]
    assert result.report["dev"]["rescored"] == 0.0 < result.report["dev"]["baseline"]
    assert max(result.report["grid"]["lambda"]) >= 2.0
    assert not any("raise" in edge for edge in result.report["edges"])  # at most a note on the plateau


def test_an_optimum_at_the_limit_is_reported():
    """Three utterances needing lambda > 0.5, > 1.1, > 1.9: with lambda_limit 1.2 the best weight found is
    the limit itself while the metric still improves there."""
    records, lm = [], {}
    for i, need in enumerate((0.5, 1.1, 1.9)):
        records += [
            dict(utt_id=f"u{i}", hyp_id=1, text=f"w{i}", score=0.0, ref=f"r{i}"),
            dict(utt_id=f"u{i}", hyp_id=2, text=f"r{i}", score=-need, ref=f"r{i}"),
        ]
        lm.update({f"w{i}": TextScore(-2.0, 1), f"r{i}": TextScore(-1.0, 1)})
    table = nbest.nbest_table(records)
    limited = rescore(table, table, mlm=lm, options=RescoreOptions(lambda_limit=1.2))
    assert limited.lam == 1.2 and "raise --lambda-limit" in limited.report["edges"][0]
    assert "Edge:" in O.render_rescore_report(limited.report)
    free = rescore(table, table, mlm=lm)
    assert 1.9 < free.lam and free.report["dev"]["rescored"] == 0.0


def test_a_plateau_keeps_its_tie_rule_choice_and_says_so():
    dev, test, lm = known_answer_lists()
    result = rescore(dev, test, mlm=lm)
    assert result.lam == 1.0  # every lambda large enough is perfect: larger ones were searched, none better
    assert max(result.report["grid"]["lambda"]) > 1.0 and "plateau" in result.report["edges"][0]


def test_defaults_use_no_length_penalty_for_wer_and_reduce_errors():
    """A long hypothesis of plausible insertions against the short right one: the PLL sum separates them,
    a per-token-like PLL (alpha = 1) barely does. Defaults (alpha = 0 for WER) fix both splits."""
    records, lm = [], {}
    for i in range(20):
        ref = f"a{i} b{i} c{i}"
        wrong = ref + " " + " ".join(f"x{i}" for _ in range(7))
        records += [
            dict(utt_id=f"u{i}", hyp_id=1, text=wrong, score=0.0, ref=ref),
            dict(utt_id=f"u{i}", hyp_id=2, text=ref, score=-0.5, ref=ref),
        ]
        lm.update({ref: TextScore(-6.0, 3), wrong: TextScore(-12.0, 10)})
    table = nbest.nbest_table(records)
    result = rescore(table, table, mlm=lm)
    assert result.report["mlm_alpha"] == 0.0 and result.report["grid"]["alpha"] == [[0.0, 0.0]]
    for split in ("dev", "test"):
        assert result.report[split]["rescored"] == 0.0 < result.report[split]["baseline"]
    penalised = rescore(table, table, mlm=lm, options=RescoreOptions(mlm_alpha=1.0, lambda_limit=1.0))
    assert penalised.report["test"]["rescored"] == penalised.report["test"]["baseline"]


def test_bleu_searches_the_length_penalty_jointly_with_lambda():
    words = "the cat sat on a mat , . dog ran".split()
    dev_records, test_records = random_lists(5, 25, words), random_lists(6, 25, words)
    lm = random_scores(dev_records + test_records, 7)
    result = rescore(
        nbest.nbest_table(dev_records), nbest.nbest_table(test_records), mlm=lm, options=RescoreOptions(metric="bleu")
    )
    assert [a for a, _ in result.report["grid"]["alpha"]] == list(BLEU_ALPHAS)
    grid = np.array(result.report["grid"]["dev"])  # (alpha, gamma, lambda)
    a = list(BLEU_ALPHAS).index(result.report["mlm_alpha"])
    chosen = grid[a, 0, result.report["grid"]["lambda"].index(result.lam)]
    assert chosen == grid.max()
    for alpha, row in zip(BLEU_ALPHAS, grid[:, 0, :]):  # each alpha's row equals a run with that alpha fixed
        fixed = rescore(
            nbest.nbest_table(dev_records),
            nbest.nbest_table(test_records),
            mlm=lm,
            options=RescoreOptions(metric="bleu", mlm_alpha=alpha),
        )
        np.testing.assert_allclose(np.array(fixed.report["grid"]["dev"])[0, 0, :21], row[:21], atol=1e-12)


def test_the_report_lists_alpha_pairs_only_when_both_lms_were_used():
    """report.md's grid line: (mlm, causal) alpha pairs with both LMs, else the one LM's alphas alone."""
    words = "the cat sat on a mat , . dog ran".split()
    dev_records, test_records = random_lists(5, 25, words), random_lists(6, 25, words)
    dev, test, lm = (
        nbest.nbest_table(dev_records),
        nbest.nbest_table(test_records),
        random_scores(dev_records + test_records, 7),
    )
    bleu = RescoreOptions(metric="bleu")
    alphas = ", ".join(f"{a:g}" for a in BLEU_ALPHAS)
    for kwargs, shown in ((dict(mlm=lm), f"mlm alpha {alphas}."), (dict(causal=lm), f"causal alpha {alphas}.")):
        markdown = O.render_rescore_report(rescore(dev, test, options=bleu, **kwargs).report)
        assert shown in markdown and "(mlm, causal)" not in markdown
    both = O.render_rescore_report(rescore(dev, test, mlm=lm, causal=lm, options=bleu).report)
    assert "(mlm, causal) alpha (0.0, 0.0), (0.2, 0.2)" in both


def test_the_best_text_order_follows_the_lists_formats():
    assert O.best_text_order({"dev": "jsonl", "test": "kaldi"}) == O.FIRST_APPEARANCE
    assert O.best_text_order({"dev": "fairseq", "test": "fairseq"}) == (
        "utterances in numeric id order (fairseq's sample ids)"
    )
    assert O.best_text_order({"dev": "marian", "test": "nemo"}) == (
        f"dev: utterances in numeric id order (Marian's source line numbers); test: {O.FIRST_APPEARANCE}"
    )
