"""N-best rescoring with LM scores (`rescore`): the weights tuned on dev, applied to test, and reported.

Salazar et al. (2020), sec. 3.1, 4.3 and appendices A, D. Every hypothesis W of an utterance gets

    total(W) = s(W) / lp_seq(W) + lambda * [ (1 - gamma) * log P(W) / lp_causal(W) + gamma * PLL(W) / lp_mlm(W) ]

with s the sequence model's log-score, PLL the masked LM's pseudo-log-likelihood, log P the causal
LM's log-probability, and the GNMT length penalty lp(W) = ((5 + |W|) / 6) ** alpha, each LM's |W|
counted in that LM's own tokens (alpha = 0 turns a penalty off). With one LM only, gamma is fixed
(1 for the MLM, 0 for the causal LM).

Defaults follow the paper's own use of length normalisation: its ASR runs apply none (WER: alpha = 0 on
the LM scores), and its NMT runs (sec. 4.3, appendix A) normalise both the sequence score (alpha =
0.6, `seq_alpha`) and the PLL (alpha = 1.0). For BLEU the LM alpha is therefore searched on dev jointly
with the weights, over `BLEU_ALPHAS` (0 included, the paper's 1.0 the top); an explicit `mlm_alpha` /
`causal_alpha` fixes it. A penalty on by default for WER would reward long hypotheses' PLL per token
and, as seen on real N-best lists, can cancel what the MLM brings.

The weights are tuned on dev by grid search (lambda in steps of 0.05 up to `lambda_max`, gamma in
steps of 0.1), minimising corpus WER (ASR) or maximising corpus BLEU (MT); among equally good points
the largest lambda wins, then the largest gamma, then the smallest alpha (appendix A). The search never
stops silently at the grid's edge: while the best lambda is the largest searched and the metric still
improved there, the lambda range is doubled (20 more points each time) up to `lambda_limit`, and the
report says when an optimum lies on an edge of what was searched. Within an utterance, equal totals
go to the sequence model's better rank. The search is fast because each hypothesis's metric sufficient
statistics (word edits and reference words; BLEU n-gram matches and lengths) are computed once with
jiwer/sacrebleu, and each grid point only takes an argmax per utterance (numpy, all utterances at
once) and sums the chosen statistics.

The caller scores every UNIQUE hypothesis text once per LM and passes `{text: TextScore}` mappings
(`combine.text_scores` builds one from a scorer's output table).

The parts: `combine` (the scores, the length penalty, each split's hypotheses as matrices and the
combination on them), `search` (the options and the grid search), `metrics` (the WER and BLEU statistics)
and `outputs` (the result, its tables' schemas, the files and report.md).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Mapping

import pyarrow as pa

from ...errors import UserError
from .combine import Split, TextScore
from .metrics import Metric, metric_for
from .outputs import FIRST_APPEARANCE, SPLITS, Rescored
from .search import RescoreOptions, Search, grid_search

logger = logging.getLogger(__name__)


def rescore(
    dev: pa.Table,
    test: pa.Table,
    mlm: Mapping[str, TextScore] | None = None,
    causal: Mapping[str, TextScore] | None = None,
    options: RescoreOptions | None = None,
) -> Rescored:
    """Tune lambda (and gamma) on `dev`, apply them to `test`, and report baseline/rescored/oracle.

    `dev` and `test` are `nbest.NBEST_SCHEMA` tables with a reference for every utterance; `mlm` and
    `causal` map every hypothesis text of both to its score (at least one of them is needed).
    """
    if mlm is None and causal is None:
        raise UserError("rescoring needs the scores of at least one LM (masked or causal)")
    options = options or RescoreOptions()
    metric = metric_for(options.metric, options.bleu_tokenize, options.bleu_lowercase)
    splits = [
        Split.build(name, table, mlm, causal, options.seq_alpha, metric) for name, table in zip(SPLITS, (dev, test))
    ]
    search = grid_search(splits[0], options, mlm is not None, causal is not None, metric)
    lam, gamma, alphas = search.best
    results = [split.result(lam, gamma, alphas, metric) for split in splits]
    summaries = {split.name: result.summary for split, result in zip(splits, results)}
    logger.info("tuned on dev: lambda=%s gamma=%s alpha=%s; %s", lam, gamma, alphas, summaries)
    for edge in search.edges:
        logger.warning("rescoring: %s", edge)
    lms = {"mlm": mlm is not None, "causal": causal is not None}
    report = _report(metric, options, search, summaries, splits[0].seq_length_source, lms)
    return Rescored(
        lam=lam,
        gamma=gamma,
        alphas=alphas,
        hypotheses=pa.concat_tables([r.hypotheses for r in results]),
        best=pa.concat_tables([r.best for r in results]),
        report=report,
    )


def _report(
    metric: Metric,
    options: RescoreOptions,
    search: Search,
    summaries: dict,
    seq_length: str | None,
    lms: dict[str, bool],
) -> dict:
    """report.json's object: the tuned weights, each split's figures, the grid as searched and how to read them."""
    lam, gamma, alphas = search.best
    return {
        "metric": metric.name,
        "higher_is_better": metric.higher_is_better,
        "scale": metric.scale,
        "lambda": lam,
        "gamma": gamma,
        "mlm_alpha": alphas[0] if lms["mlm"] else None,
        "causal_alpha": alphas[1] if lms["causal"] else None,
        **summaries,
        "lms": lms,
        "options": asdict(options),
        "seq_length": seq_length,
        "grid": {
            "lambda": search.lambdas.tolist(),
            "gamma": search.gammas.tolist(),
            "alpha": [list(a) for a in search.alphas],
            "dev": search.grid.tolist(),
        },
        "edges": search.edges,
        "tie_rule": "largest lambda, then largest gamma, then smallest alpha; within an utterance, the better "
        "sequence-model rank",
        "best_text_order": FIRST_APPEARANCE,
        "signature": metric.signature(),
    }
