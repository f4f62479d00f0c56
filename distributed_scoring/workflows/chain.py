"""`dscore score --method chain`: the chain-rule log-likelihood of every input row, then summary.json.

The corpus figure is the perplexity PPL = exp(-sum log_likelihood / sum n_tokens) over the ok rows (per
word with n_words), summed once as for the PLL. In sequential order (`l2r`) and with one random order
per sentence it is Liao et al.'s PPL(sequential) and PPL(random) (Tables 2-3). With K random orders per
sentence the rows average them in probability space, and `by_order` reports the spread: the corpus PPL
of the k-th order of every sentence, for each k (K replicates of the paper's PPL(random)), and the mean
over sentences of the standard deviation of their K log-likelihoods. For a u-PMLM the chain is its
likelihood; for any other MLM it is an approximation (its conditionals need not form one joint).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..config import RayOptions, RunConfig
from ..errors import DataLossError, UserError
from ..io import schema as S
from ..measures import pppl
from ..pipeline.aggregate import (
    SUMMARY_VERSION,
    add_by_partition,
    one_or_all,
    signatures,
    unknown_tokens,
    unknown_warnings,
)
from ..pipeline.memory import check_memory, text_tokens
from ..pipeline.runner import Finished, run
from ..pipeline.stats import CorpusStats
from ..workloads.chain import (
    CHAIN,
    LOG_LIKELIHOOD,
    LOG_LIKELIHOOD_STD,
    LOG_LIKELIHOODS,
    ChainOptions,
    chain_workload,
    memory_estimate,
)
from ..workloads.pll import row_cost

__all__ = ["ChainOptions", "score_chain"]  # ChainOptions: what the CLI builds a run from

logger = logging.getLogger(__name__)

LIKELIHOOD_NOTE = (
    "the likelihood of a u-PMLM (Liao et al., 2020) in this order; for other masked LMs an "
    "approximation, since their conditionals need not form one joint distribution"
)


def score_chain(
    config: RunConfig,
    options: ChainOptions,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict:
    """Chain log-likelihood of every input row; returns the summary (also written to summary.json).

    The tokenizer is loaded here first, so a model that cannot be used, or options of the PLL alone,
    stop the run before any file is written.
    """
    from ..engine.model_files import load_tokenizer

    scoring = config.scoring
    if scoring.per_token or scoring.word_scores or scoring.variant != "original":
        raise UserError(
            "--per-token, --word-scores and --variant are options of --method pll; "
            "--method chain writes one log-likelihood per row"
        )
    tokenizer, max_length = load_tokenizer(config.model)
    if tokenizer.mask_token is None:
        raise UserError(f"{config.model.name!r} has no mask token, so it has no masked conditionals to chain")
    check_memory(
        "dscore score --method chain", memory_estimate(options, config.inputs.shard_rows, text_tokens(max_length))
    )
    cost = row_cost(config.model, passes_per_token=float(options.orders))
    workload = chain_workload(config.model, options, scoring.batch_tokens, cost)
    return run(config, workload, ray, overwrite, progress=progress, summarise=lambda done: summarize(done, options))


@dataclass(frozen=True)
class ChainStats:
    """The corpus statistics of chain rows (`CorpusStats` summing `log_likelihood` in place of the PLL),
    their unknown tokens and the orders' spread; `a + b` merges shards. `by_order[k]` sums the k-th
    order's log-likelihood of every ok row (rows of one run have K each)."""

    corpus: CorpusStats = CorpusStats()
    n_unknown: int = 0
    mostly_unknown_rows: int = 0
    sum_order_std: float = 0.0
    by_order: tuple[float, ...] = ()

    def __add__(self, other: "ChainStats") -> "ChainStats":
        by_order = tuple(a + b for a, b in zip(self.by_order, other.by_order)) or self.by_order or other.by_order
        return ChainStats(
            self.corpus + other.corpus,
            self.n_unknown + other.n_unknown,
            self.mostly_unknown_rows + other.mostly_unknown_rows,
            self.sum_order_std + other.sum_order_std,
            by_order,
        )

    @classmethod
    def of_table(cls, table: pa.Table) -> "ChainStats":
        ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK))
        per_order = np.array(ok[LOG_LIKELIHOODS].to_pylist(), dtype=np.float64)  # (ok rows, K)
        return cls(
            CorpusStats.of_table(table, score=LOG_LIKELIHOOD),
            *unknown_tokens(table),
            float(pc.sum(ok[LOG_LIKELIHOOD_STD]).as_py() or 0.0),
            tuple(per_order.sum(axis=0).tolist()) if ok.num_rows else (),
        )

    def to_dict(self) -> dict:
        """The PLL summary's figures under the chain's names: `sum_log_likelihood`, `ppl_token`, `ppl_word`."""
        c = self.corpus
        return {
            "rows": c.rows,
            "ok": c.ok,
            "errors": c.errors,
            "sum_log_likelihood": c.sum_pll,
            "n_tokens": c.n_tokens,
            "n_words": c.n_words,
            "n_unknown": self.n_unknown,
            "mostly_unknown_rows": self.mostly_unknown_rows,
            "ppl_token": c.pppl_token,
            "ppl_word": c.pppl_word,
        }

    def spread(self) -> dict:
        """The corpus PPL of each order index, their range and standard deviation, and the mean
        per-sentence standard deviation of the orders' log-likelihoods."""
        ppls = [pppl(total, self.corpus.n_tokens) for total in self.by_order]
        known = [p for p in ppls if p is not None]
        return {
            "ppl_token": ppls,
            "min": min(known, default=None),
            "max": max(known, default=None),
            "std": float(np.std(known)) if known else None,
            "mean_log_likelihood_std": self.sum_order_std / self.corpus.ok if self.corpus.ok else None,
        }


def summarize(done: Finished, options: ChainOptions) -> dict:
    """Sum the statistics of the finished run's rows (one file at a time) and return summary.json's content:
    the PLL summary's layout with the chain's figures."""
    out, plan, config = done.out, done.plan, done.config
    columns = [S.STATUS, LOG_LIKELIHOOD, LOG_LIKELIHOODS, LOG_LIKELIHOOD_STD, S.N_TOKENS, S.N_WORDS, S.N_UNKNOWN]
    partitioned = config.inputs.partitioned
    stats, by_input, by_partition = ChainStats(), {}, {}
    for shard in plan:
        table = pq.read_table(
            out.part_path(shard.key), columns=columns + ([S.PARTITION] if partitioned else []), filesystem=out.fs
        )
        shard_stats = ChainStats.of_table(table)
        stats += shard_stats
        by_input[shard.file.name] = by_input.get(shard.file.name, ChainStats()) + shard_stats
        if partitioned:
            add_by_partition(by_partition, table, ChainStats.of_table)
    expected = sum(s.rows for s in plan)
    if stats.corpus.rows != expected:
        raise DataLossError(f"{expected} rows in, {stats.corpus.rows} rows out; rerun the same command")
    warnings = unknown_warnings(stats.mostly_unknown_rows, stats.corpus.ok)
    for warning in warnings:
        logger.warning(warning)
    summary = {
        **stats.to_dict(),
        "version": SUMMARY_VERSION,
        "variant": CHAIN,
        "warnings": warnings,
        "method": CHAIN,
        "order": options.order,
        "orders": options.orders,
        "seed": options.seed,
        "likelihood": LIKELIHOOD_NOTE,
        "by_order": stats.spread(),
        "rows_expected": expected,
        "model": config.model.name,
        "inputs": list(config.inputs.paths),
        "shards": len(plan),
        "signature": one_or_all(signatures(done.markers.values())),
        "by_input": {name: s.to_dict() for name, s in by_input.items()},
    }
    if partitioned:
        summary["by_partition"] = {str(name): s.to_dict() for name, s in sorted(by_partition.items(), key=str)}
    return summary
