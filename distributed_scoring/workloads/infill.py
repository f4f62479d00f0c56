"""The infilling workload (`dscore infill`, Calef et al.): its options, its two stages and its rows.

Input rows are texts with the model's own mask token (`[MASK]`, `<mask>`, ...) once per token to fill,
and optionally the true fill in an answer column (tokens separated by spaces). The prepare stage
tokenises (tokenizer only) and turns what cannot be filled into error rows: no mask token, more masks
than `max_masks`, a mask glued to letters or digits (inside a word: a mask stands for a whole token),
a text longer than the model, an answer with another number of tokens. The score stage runs
`engine.infill` on every fillable row of the shard at once and writes the `top` best fills; with an
answer, the rank of the first fill that matches it and the matching tokens of the best one, which the
workflow's summary turns into accuracies and BLEU. The engine (torch) is imported by the scorer on its
actor, never on the driver.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec
from ..engine.infill_settings import InfillSettings
from ..errors import UserError
from ..io import schema as S
from ..options import by_name, carried, check, option, words
from ..pipeline.memory import BEAM_BYTES, CANDIDATE_BYTES, ROW_BYTES, TOKEN_BYTES, MemoryEstimate
from ..pipeline.progress import ignore, part
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .masked import SPANS, MaskedPreparer, unanswerable

if TYPE_CHECKING:
    from ..engine.infill import Fill
    from ..engine.masked_lm import MaskedLM

# What `dscore infill` offers of the engine's decoders and fill orders (`engine.infill`): not `filtered` or
# `given`, which are generation's.
INFILL_DECODERS = ("standard", "hcb", "exact", "sample", "temperature", "top-k", "top-p")
INFILL_ORDERS = ("l2r", "best-to-worst")
DECLARED = Declaration(  # --rescore-pll: pll's engine too
    "infill", engines=("engine.infill",), docs="docs/infill.md", output=lambda: output_schema(InfillOptions())
)

ANSWER, MASKS, DECODER, ORDER, N_MASKS = "answer", "masks", "decoder", "order", "n_masks"
BEAMS, BEST, RANK, CORRECT_TOKENS, PLL = "beams", "best", "rank", "correct_tokens", "pll"
BEAMS_HCB, RANK_HCB, BEAMS_PLL, RANK_PLL = "beams_hcb", "rank_hcb", "beams_pll", "rank_pll"

# A fill's `score` is its chain log-probability (<= 0), except under `hcb`: there it is the HCB log-ratio
# log p(fill) - log p(pivots), usually positive, as the pivot (the mask token) is improbable in context.
BEAM = pa.struct(
    [pa.field("tokens", pa.list_(pa.string())), pa.field("text", pa.string()), pa.field("score", pa.float64())]
)

PREPARED_SCHEMA = pa.schema(
    [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(S.INPUT_IDS, pa.list_(pa.int64())),
        pa.field(MASKS, pa.list_(pa.int32())),
        pa.field(SPANS, pa.list_(pa.list_(pa.int32()))),
        pa.field(ANSWER, pa.string()),
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
    ]
)


@dataclass(frozen=True)
class InfillOptions:
    """What changes an infilling run's rows (every field enters the run's fingerprint): the engine's settings
    (`engine.infill_settings.InfillSettings`, carried by name, with their flags and checks, `sample_top_k`
    being its `top_k`) and the workload's own fields, each declared with its flag."""

    decoder: str = carried(InfillSettings, "decoder", choices=INFILL_DECODERS)
    order: str = carried(InfillSettings, "order", choices=INFILL_ORDERS)
    beam: int = carried(InfillSettings, "beam")
    top: int | None = option(None, "fills written per row, best first (default: --beam of them)", low=1, type=int)
    vocab_restrict: tuple[str, ...] | None = option(  # the only tokens a fill may use; None: every non-special one
        None,
        "the only tokens a fill may use, space-separated, as the tokenizer writes them or as they "
        'read (e.g. the 20 amino acids "A C D ...")',
        read=words,
    )
    pivot: str | None = option(None, "HCB pivot token (default: the mask token)")  # None: the mask token
    temperature: float = carried(InfillSettings, "temperature")
    sample_top_k: int = carried(InfillSettings, "top_k")
    top_p: float = carried(InfillSettings, "top_p")
    seed: int = option(0, "seed of the samplers (with each row's id)")
    max_masks: int = option(8, "rows with more mask tokens are error rows (default {default})", low=1)
    exact_limit: int = option(  # fills `exact` may enumerate per row
        10_000, "most fills `exact` enumerates per row, |V|^masks (default {default:,})", low=1
    )
    rescore_pll: bool = option(False, "also write the PLL of each written fill")
    answer_column: str = option(
        ANSWER, "column with the true fill, tokens separated by spaces, for accuracy and BLEU (optional)"
    )

    def __post_init__(self) -> None:
        check(self)
        self.settings(pivot=None)  # the engine's checks of the fields it shares
        if self.written > self.beam and self.decoder != "exact":
            raise UserError(f"--top {self.top} is more than --beam {self.beam}: a search keeps only --beam fills")

    def settings(self, pivot: int | None) -> InfillSettings:
        """The engine's settings of these options, HCB's pivot given as a token id."""
        return by_name(InfillSettings, self, pivot=pivot, top_k=self.sample_top_k)

    @property
    def written(self) -> int:
        """Fills written per row, best first."""
        return self.beam if self.top is None else self.top


def example_seed(seed: int, row_id: str) -> int:
    """A row's sampling seed: from the run's seed and the row's id, so results do not depend on sharding."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{row_id}".encode(), digest_size=8).digest(), "little")


def allowed_tokens(tokenizer: Any, vocab_size: int, restrict: tuple[str, ...] | None) -> np.ndarray:
    """(V,) bool: the tokens a fill may use. Special tokens never; ids past the tokenizer's are no tokens."""
    allowed = np.zeros(vocab_size, dtype=bool)
    if restrict is None:
        allowed[: len(tokenizer)] = True
    else:
        vocab = tokenizer.get_vocab()
        # a word as it reads, or as byte-level BPE (`Ġfox`) and SentencePiece (`▁fox`) write it after a space
        found = {t: next((f for f in (t, "Ġ" + t, "▁" + t) if f in vocab), None) for t in restrict}
        unknown = [t for t, f in found.items() if f is None]
        if unknown:
            raise UserError(
                f"--vocab-restrict tokens not in the model's vocabulary: {' '.join(unknown[:10])}; "
                "give tokens as the tokenizer writes them"
            )
        allowed[[vocab[f] for f in found.values()]] = True
    allowed[[i for i in tokenizer.all_special_ids if i < vocab_size]] = False
    if not allowed.any():
        raise UserError("no token is left to fill with: --vocab-restrict holds only special tokens")
    return allowed


def pivot_id(tokenizer: Any, pivot: str | None) -> int | None:
    """HCB's pivot token id (None: the mask token); a token outside the vocabulary is refused, since
    the tokenizer would silently read it as the unknown token."""
    if pivot is None:
        return None
    if pivot not in tokenizer.get_vocab():
        raise UserError(f"--pivot {pivot!r} is not a token of the model's vocabulary")
    return tokenizer.convert_tokens_to_ids(pivot)


def surface(tokenizer: Any, token: str) -> str:
    """How a token reads in text (`Ġfox` -> `fox`); what answers may be written as."""
    return tokenizer.convert_tokens_to_string([token]).strip()


def matches(tokenizer: Any, token: str, answer: str) -> bool:
    """An answer's token is right when it equals the token as the tokenizer writes it or as it reads."""
    return answer == token or answer == surface(tokenizer, token)


def written_into(tokenizer: Any, text: str, spans: Sequence[Sequence[int]], tokens: Sequence[str]) -> str:
    """`text` with the characters of each span replaced by its token as the token reads."""
    out, at = [], 0
    for (start, end), token in zip(spans, tokens):
        out += [text[at:start], surface(tokenizer, token)]
        at = end
    return "".join(out) + text[at:]


class InfillPreparer(MaskedPreparer):
    """Finds the masks, and makes error rows of what cannot be filled."""

    writes = PREPARED_SCHEMA
    positions = MASKS

    def carried(self, row: Row) -> Row:
        return {ANSWER: row.get(self.options.answer_column)}

    def refuse(self, text: str) -> str | None:
        mask = self.tokenizer.mask_token
        if mask not in text:
            return f"no mask token {mask!r} in the text: write one {mask} for each token to fill"
        return None

    def locate(self, row: Row, ids: list[int], offsets: Sequence[tuple[int, int]]) -> Row | str:
        masks, text = self.masks(ids), row[S.TEXT]
        if len(masks) > self.options.max_masks:
            return f"{len(masks)} mask tokens, more than --max-masks {self.options.max_masks}"
        for start, end in (offsets[i] for i in masks):
            if (start > 0 and text[start - 1].isalnum()) or (end < len(text) and text[end].isalnum()):
                return (
                    f"mask token inside a word ({text[max(0, start - 10) : end + 10]!r}): a mask stands for a "
                    "whole token; put spaces around it"
                )
        return unanswerable(row.get(self.options.answer_column), len(masks), "mask tokens") or {MASKS: masks}


class InfillScorer(Stage):
    """Fills every fillable row of a shard in one search; error rows pass through."""

    reads = {name: f"from the infill prepare stage ({name})" for name in PREPARED_SCHEMA.names}

    def __init__(
        self, model: ModelSpec, options: InfillOptions, batch_tokens: int | None = None, mlm: MaskedLM | None = None
    ) -> None:
        from ..engine.infill import InfillEngine, exact_size
        from ..engine.masked_lm import load_masked_lm
        from ..engine.pll import PLLEngine

        self.mlm = mlm or load_masked_lm(model)
        self.options, self.model_name = options, model.name
        tokenizer = self.mlm.tokenizer
        allowed = allowed_tokens(tokenizer, self.mlm.model.config.vocab_size, options.vocab_restrict)
        self.n_allowed = int(allowed.sum())
        self.exact_size = exact_size
        self.engine = InfillEngine(self.mlm, allowed, batch_tokens)
        self.pll = PLLEngine(self.mlm, "original", batch_tokens) if options.rescore_pll else None
        self.settings = options.settings(pivot_id(tokenizer, options.pivot))
        self.signature = {**self.mlm.signature, "decoder": options.decoder, "order": options.order}

    def output_schema(self, columns: Sequence[str]) -> pa.Schema:
        return output_schema(self.options)

    def process(self, rows: list[Row]) -> list[Row]:
        from ..engine.infill import InfillExample

        fillable = []  # places in `rows`: fills are joined back by place, since ids need not be unique
        for i, row in enumerate(rows):
            if row[S.STATUS] == S.STATUS_OK and self.options.decoder == "exact":
                size = self.exact_size(self.n_allowed, len(row[MASKS]))
                if size > self.options.exact_limit:
                    row.update(
                        {
                            S.STATUS: S.STATUS_ERROR,
                            S.ERROR: (
                                f"exact search over {self.n_allowed}^{len(row[MASKS])} = {size:,} fills is over "
                                f"--exact-limit {self.options.exact_limit:,}: "
                                "restrict the vocabulary or use a beam decoder"
                            ),
                        }
                    )
            if row[S.STATUS] == S.STATUS_OK:
                fillable.append(i)
        examples = [
            InfillExample(
                np.array(rows[i][S.INPUT_IDS], dtype=np.int64),
                np.array(rows[i][MASKS], dtype=np.int64),
                example_seed(self.options.seed, rows[i][S.ID]),
            )
            for i in fillable
        ]
        # With --rescore-pll the search is the first half of the shard's progress, the PLL pass over its fills
        # (in `_row`) the second.
        searched = self.engine.search(
            examples, self.settings, self.report if self.pll is None else part(self.report, 0, 2)
        )
        fills = dict(zip(fillable, searched))
        rescored = ignore if self.pll is None else part(self.report, 1, 2)
        out = []
        for done, row in enumerate(rows, start=1):
            out.append(self._row(row, fills.get(done - 1)))
            rescored(done, len(rows))
        return out

    def _row(self, row: Row, fills: list[Fill] | None) -> Row:
        out = {
            **S.key(row),
            S.TEXT: row[S.TEXT],
            DECODER: self.options.decoder,
            ORDER: self.options.order,
            ANSWER: row[ANSWER],
            N_MASKS: len(row[MASKS]) if fills is not None else 0,
            BEAMS: None,
            BEST: None,
            RANK: None,
            CORRECT_TOKENS: None,
            S.STATUS: row[S.STATUS],
            S.ERROR: row[S.ERROR],
            S.MODEL: self.model_name,
        }
        if fills is None:
            return {**out, **{name: None for name in output_schema(self.options).names if name not in out}}
        answer = row[ANSWER].split() if row[ANSWER] is not None else None
        hcb = self.options.decoder == "hcb"
        ranked = [(f, f.hcb if hcb else f.chain) for f in fills]
        out.update(self._ranking(row, ranked, answer, BEAMS, RANK))
        out[BEST] = out[BEAMS][0]["text"]
        if answer is not None:
            out[CORRECT_TOKENS] = sum(self._matches(t, a) for t, a in zip(self._tokens(fills[0]), answer))
        plls = self._plls(row, fills) if self.pll is not None else None
        if self.options.rescore_pll:
            out[PLL] = plls[: self.options.written]
        if self.options.decoder == "exact":
            by_hcb = sorted(((f, f.hcb) for f in fills), key=lambda x: x[1], reverse=True)
            out.update(self._ranking(row, by_hcb, answer, BEAMS_HCB, RANK_HCB))
            if plls is not None:
                by_pll = sorted(zip(fills, plls), key=lambda x: x[1], reverse=True)
                out.update(self._ranking(row, by_pll, answer, BEAMS_PLL, RANK_PLL))
        return out

    def _ranking(
        self, row: Row, ranked: list[tuple[Fill, float]], answer: list[str] | None, beams: str, rank: str
    ) -> Row:
        """The top fills of one ranking as beams, and the 1-based rank of the first that is the answer."""
        top = [
            {"tokens": self._tokens(f), "text": self._text(row, f), "score": float(s)}
            for f, s in ranked[: self.options.written]
        ]
        found = None
        if answer is not None:
            found = next(
                (
                    i + 1
                    for i, (f, _) in enumerate(ranked)
                    if all(self._matches(t, a) for t, a in zip(self._tokens(f), answer))
                ),
                None,
            )
        return {beams: top, rank: found}

    def _tokens(self, fill: Fill) -> list[str]:
        return self.mlm.tokenizer.convert_ids_to_tokens(fill.tokens.tolist())

    def _matches(self, token: str, answer: str) -> bool:
        return matches(self.mlm.tokenizer, token, answer)

    def _text(self, row: Row, fill: Fill) -> str:
        """The text with each mask token replaced by its fill, as the fill reads."""
        return written_into(self.mlm.tokenizer, row[S.TEXT], row[SPANS], self._tokens(fill))

    def _plls(self, row: Row, fills: list[Fill]) -> list[float]:
        """PLL of each completed sequence (every non-special token masked in turn)."""
        from ..engine.masking import Sentence

        specials = set(self.mlm.tokenizer.all_special_ids)
        sentences = []
        for fill in fills:
            ids = np.array(row[S.INPUT_IDS], dtype=np.int64)
            ids[row[MASKS]] = fill.tokens
            targets = np.array([i for i, t in enumerate(ids.tolist()) if t not in specials], dtype=np.int64)
            sentences.append(Sentence(ids, targets, np.arange(len(ids), dtype=np.int64)))
        return [float(lp.sum()) for lp in self.pll.token_logprobs(sentences)]


def output_schema(options: InfillOptions) -> pa.Schema:
    """The rows `dscore infill` writes: `pll` with --rescore-pll; the HCB (and PLL) rankings for `exact`."""
    fields = [
        pa.field(S.ID, pa.string(), nullable=False),
        pa.field(S.TEXT, pa.string()),
        pa.field(DECODER, pa.string(), nullable=False),
        pa.field(ORDER, pa.string(), nullable=False),
        pa.field(BEAMS, pa.list_(BEAM)),
        pa.field(BEST, pa.string()),
        pa.field(ANSWER, pa.string()),
        pa.field(N_MASKS, pa.int32(), nullable=False),
        pa.field(RANK, pa.int32()),
        pa.field(CORRECT_TOKENS, pa.int32()),
    ]
    if options.rescore_pll:
        fields.append(pa.field(PLL, pa.list_(pa.float64())))
    if options.decoder == "exact":
        fields += [pa.field(BEAMS_HCB, pa.list_(BEAM)), pa.field(RANK_HCB, pa.int32())]
        if options.rescore_pll:
            fields += [pa.field(BEAMS_PLL, pa.list_(BEAM)), pa.field(RANK_PLL, pa.int32())]
    fields += [
        pa.field(S.STATUS, pa.string(), nullable=False),
        pa.field(S.ERROR, pa.string()),
        pa.field(S.MODEL, pa.string(), nullable=False),
    ]
    return pa.schema(fields)


def memory_estimate(options: InfillOptions, shard_rows: int, tokens: int, n_allowed: int) -> MemoryEstimate:
    """What one shard's search holds at once (every fillable row is searched together): per row, its beams
    (chains for samplers, every fill for `exact`, up to --exact-limit: a row with more is an error row),
    each a copy of the tokens, with the candidates of its step (the top --beam; every allowed token for a
    sampler; for `exact`, as many in all as fills), and the written fills."""
    if options.decoder == "exact":
        width, candidates = options.exact_limit, 1
        what, flags = f"up to {width:,} fills", "--exact-limit or --shard-rows"
    else:
        sampler = options.decoder not in ("standard", "hcb")
        width, candidates = options.beam, n_allowed if sampler else min(options.beam, n_allowed)
        what, flags = f"{width:,} beams", "--beam or --shard-rows"
    per_row = (
        width * (BEAM_BYTES + 8 * tokens + CANDIDATE_BYTES * candidates)
        + options.written * TOKEN_BYTES * tokens
        + ROW_BYTES
    )
    return MemoryEstimate(shard_rows * per_row, f"one shard of {shard_rows} rows x {what}", flags)


def infill_workload(model: ModelSpec, options: InfillOptions, batch_tokens: int | None = None) -> Workload:
    """Infilling of masked spans (`dscore infill`)."""
    return DECLARED.workload(
        options,
        partial(InfillPreparer, model, options),
        partial(InfillScorer, model, options, batch_tokens),
        model.device,
    )
