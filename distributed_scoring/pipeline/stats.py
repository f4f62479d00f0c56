"""Summable corpus statistics and pseudo-perplexity.

As in sacrebleu and jiwer, per-item sufficient statistics are summed and the corpus figure is computed
once: PPPL = exp(-sum PLL / sum N) over the whole corpus (Salazar et al., 2020, sec. 2.3), never a mean
of per-sentence perplexities.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..io import schema as S
from ..measures import pppl

# The columns of scored rows that `CorpusStats.of_table` reads.
STAT_COLUMNS = [S.STATUS, S.PLL, S.N_TOKENS, S.N_WORDS]


@dataclass(frozen=True)
class CorpusStats:
    """Counts and sums over scored rows; `a + b` merges shards. Only ok rows enter the sums. `sum_pll`
    sums the rows' log-likelihood score: the PLL, or another score in its place (`of_table(score=...)`,
    the chain rule's log-likelihood)."""

    rows: int = 0
    ok: int = 0
    errors: int = 0
    sum_pll: float = 0.0
    n_tokens: int = 0
    n_words: int = 0

    def __add__(self, other: "CorpusStats") -> "CorpusStats":
        return CorpusStats(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple:
        return (self.rows, self.ok, self.errors, self.sum_pll, self.n_tokens, self.n_words)

    @property
    def pppl_token(self) -> float | None:
        return pppl(self.sum_pll, self.n_tokens)

    @property
    def pppl_word(self) -> float | None:
        return pppl(self.sum_pll, self.n_words)

    def to_dict(self) -> dict:
        return {**asdict(self), "pppl_token": self.pppl_token, "pppl_word": self.pppl_word}

    @classmethod
    def of_table(cls, table: pa.Table, score: str = S.PLL) -> "CorpusStats":
        """Statistics of a table of scored rows (only the status, `score` and count columns are read)."""
        ok = pc.equal(table[S.STATUS], S.STATUS_OK)
        n_ok = pc.sum(ok.cast(pa.int64())).as_py() or 0

        def total(column: str) -> float:
            return pc.sum(pc.filter(table[column], ok)).as_py() or 0

        return cls(
            rows=table.num_rows,
            ok=n_ok,
            errors=table.num_rows - n_ok,
            sum_pll=float(total(score)),
            n_tokens=int(total(S.N_TOKENS)),
            n_words=int(total(S.N_WORDS)),
        )
