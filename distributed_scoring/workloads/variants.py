"""The site tables of `dscore variants` (Meier et al., 2021): for each sequence read, the log-probability of every
residue of the model's alphabet at the positions its variants touch, with that position masked (the masked
marginal: one masked copy per position) or from the sequence as it is (the wild-type and mutant marginals:
one pass). The variants' scores are sums over their sites of two entries of these tables, joined on the driver
(`workflows.variants`): a wild type's table is computed once, whatever the number of its variants.

A read row is a sequence (`text`, residues without spaces) and the 0-based positions to tabulate (`sites`,
space-separated). Residues become token ids by the model's own alphabet (one token per residue, found by the
workflow from the tokenizer, `ResidueVocabulary`), so no tokenizer runs here. A sequence longer than the
model's window is read in windows centred on each position, or, with `windows="proteingym"`, in the windows
ProteinGym's ESM script slices (`engine.windows`). The engine (torch) is imported by the score stage on its
actor.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec
from ..errors import UserError
from ..io import schema as S
from ..io.dms import MUTANT, MUTATED_SEQUENCE, TARGET_SEQ, Site, mutated, parse_mutant
from ..options import option
from ..pipeline.stage import Row, Stage
from ..pipeline.workload import Declaration, Workload
from .pll import isolated

if TYPE_CHECKING:
    from ..engine.masked_lm import MaskedLM
    from ..engine.masking import Sentence

DECLARED = Declaration("variant-sites", engines=("engine.variants",), docs="docs/variants.md")

STRATEGIES = ("wt-marginal", "masked-marginal", "mutant-marginal", "pll")
MARGINALS = STRATEGIES[:3]  # read from site tables; `pll` from the PLLs of whole sequences
WINDOWS = ("centred", "proteingym")  # how a sequence longer than the model is read (SiteOptions.windows)

SITES = "sites"  # read: the 0-based positions to tabulate, space-separated
POSITIONS = "positions"  # written: those positions, in order
LOGPROBS = "logprobs"  # written: (positions x alphabet) log-probabilities, row-major
PASSES = "passes"  # written: the sequences this row ran through the model (masked copies, or windows)


@dataclass(frozen=True)
class ResidueVocabulary:
    """One token per residue: the model's id of each residue letter, and the special tokens around a sequence."""

    ids: dict[str, int]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    @property
    def alphabet(self) -> str:
        """The residues of the tables' columns, in order."""
        return "".join(self.ids)


@dataclass(frozen=True)
class Variant:
    """One variant, read: its key (the `mutant`, or the sequence of a row that names none), its substitutions
    (None for an indel), the sequence it makes, or why it cannot be scored (its row's error)."""

    key: str | None
    sites: tuple[Site, ...] | None
    sequence: str | None
    error: str | None


def residue_vocabulary(tokenizer: Any, model: str, strategy: str, target: str) -> ResidueVocabulary | None:
    """The model's token of each residue letter and its special tokens around a sequence, checked on the wild
    type `target`: its residues, spaced, must be one token each (what the marginals read). None for `pll`, which
    takes any tokenisation (a residue the model cannot read is then an error row)."""
    if strategy not in MARGINALS:
        return None
    ids = {}
    for letter in string.ascii_uppercase:
        token = tokenizer.convert_tokens_to_ids(letter)
        if isinstance(token, int) and token != tokenizer.unk_token_id:
            ids[letter] = token
    residues = [r for r in target if r in ids][:50]  # a residue it lacks makes its assay's rows errors, not this
    encoded = list(tokenizer(" ".join(residues))["input_ids"])
    body = [ids[r] for r in residues]
    start = next((i for i in range(len(encoded) - len(body) + 1) if encoded[i : i + len(body)] == body), None)
    if len(ids) < 20 or not residues or start is None:
        raise UserError(
            f"the model {model!r} does not give one token per residue (its tokenizer has a token of its own for "
            f"{len(ids)} of the 26 residue letters, and makes {len(encoded)} tokens, specials included, of "
            f"{len(residues)} residues of the wild type it has): the {strategy} strategy reads one position per "
            "residue; use a per-residue protein model, or --strategy pll"
        )
    return ResidueVocabulary(ids, tuple(encoded[:start]), tuple(encoded[start + len(body) :]))


def read_variant(
    mutant: str | None,
    given: str | None,
    target: str,
    strategy: str,
    offset: int = 1,
    vocabulary: ResidueVocabulary | None = None,
) -> Variant:
    """What one row scores (its `mutant` applied to `target`, or for `pll` a `mutated_sequence` that no
    substitutions make: an indel), or why it cannot be scored."""
    key = mutant if mutant is not None else given
    if mutant is None and given is None:
        return Variant(None, None, None, f"the row names no {MUTANT} and no {MUTATED_SEQUENCE}")
    if not target:
        return Variant(key, None, None, f"the assay has no {TARGET_SEQ} (its wild type): give it in the reference file")
    sites = parse_mutant(mutant, target, offset) if mutant is not None else f"the row names no {MUTANT}"
    if isinstance(sites, str):
        if strategy == "pll" and given is not None and (mutant is None or not _substitutions(mutant)):
            return Variant(key, None, given.upper(), None)  # an indel: the PLL difference scores any sequence
        if given is not None and len(given) != len(target) and strategy != "pll":
            sites = (
                f"an indel ({len(given)} residues, the target {len(target)}): the {strategy} strategy scores "
                "substitutions only; --strategy pll scores indels"
            )
        return Variant(key, None, None, sites)
    sequence = mutated(target, sites)
    if given is not None and given.upper() != sequence:
        return Variant(key, None, None, f"{MUTATED_SEQUENCE} is not the target with {mutant} applied (check --offset)")
    outside = sorted({s.mutant for s in sites if s.mutant not in vocabulary.ids}) if vocabulary else []
    if outside:
        error = f"the residue(s) {''.join(outside)!r} are not in the model's alphabet ({vocabulary.alphabet})"
        return Variant(key, None, None, error)
    return Variant(key, tuple(sites), sequence, None)


def _substitutions(mutant: str) -> bool:
    """Whether `mutant` is written as substitutions (then one that does not apply is an error, not an indel)."""
    parts = [p.strip() for p in mutant.split(":")]
    return all(p[:1].isalpha() and p[-1:].isalpha() and p[1:-1].lstrip("-").isdigit() for p in parts)


def table_key(assay: str, variant: Variant, strategy: str) -> str:
    """The id of the sequence row whose site table scores the variant: its wild type's (the assay's), or, for
    the mutant marginal, its own."""
    return f"{assay}/{variant.key}" if strategy == "mutant-marginal" else assay


def sequences(assays: Sequence[tuple[str, str, list[Variant]]], strategy: str) -> dict[str, list]:
    """What the model reads for (assay, wild type, variants) groups, as columns. Marginals: `id`, `text` and the
    `sites` to tabulate (a wild type with the positions its variants touch; for the mutant marginal each
    variant's sequence with its own). PLL: every distinct sequence, wild types included, its id its number."""
    if strategy == "pll":
        distinct: dict[str, None] = {}
        for _, target, variants in assays:
            ok = [v.sequence for v in variants if v.error is None]
            if ok:
                distinct.update(dict.fromkeys([target, *ok]))
        return {S.ID: [f"{i:09d}" for i in range(len(distinct))], S.TEXT: list(distinct)}
    ids, texts, sites = [], [], []
    for assay, target, variants in assays:
        ok = [v for v in variants if v.error is None]
        if strategy == "mutant-marginal":
            for v in ok:
                ids.append(table_key(assay, v, strategy))
                texts.append(v.sequence)
                sites.append(" ".join(str(s.position) for s in v.sites))
        elif ok:
            ids.append(assay)
            texts.append(target)
            sites.append(" ".join(map(str, sorted({s.position for v in ok for s in v.sites}))))
    return {S.ID: ids, S.TEXT: texts, SITES: sites}


def sequences_schema(strategy: str) -> pa.Schema:
    """The columns `sequences` gives, typed: a table with no variant to score still makes a file with string
    columns (an empty list has no type of its own)."""
    fields = [pa.field(S.ID, pa.string()), pa.field(S.TEXT, pa.string())]
    return pa.schema(fields if strategy == "pll" else [*fields, pa.field(SITES, pa.string())])


def variant_scores(
    assay: str, target: str, variants: list[Variant], strategy: str, found: dict[str, Any], alphabet: str = ""
) -> list[tuple[float | None, str | None]]:
    """(score, error) of each variant, joined by key to what was `found`: the site tables by row id ({position:
    log-probabilities over `alphabet`}) for the marginals, the PLLs by sequence for `pll`, or their rows' errors."""
    column = {r: j for j, r in enumerate(alphabet)}
    out: list[tuple[float | None, str | None]] = []
    for v in variants:
        if v.error is not None:
            out.append((None, v.error))
        elif strategy == "pll":
            mine, wild = found.get(v.sequence), found.get(target)
            failed = next((x for x in (mine, wild) if not isinstance(x, float)), None)
            out.append((None, _why(failed)) if failed is not None else (mine - wild, None))
        else:
            table = found.get(table_key(assay, v, strategy))
            if not isinstance(table, dict):
                out.append((None, _why(table)))
                continue
            terms = [table[s.position][column[s.mutant]] - table[s.position][column[s.wild]] for s in v.sites]
            out.append((float(sum(terms)), None))
    return out


def found_tables(rows: Sequence[Row], alphabet: str) -> dict[str, Any]:
    """Scored site rows as `variant_scores` joins them: each row's table by its id, or its error."""
    return {r[S.ID]: tabulated(r, alphabet) if r[S.STATUS] == S.STATUS_OK else r[S.ERROR] for r in rows}


def found_plls(rows: Sequence[Row]) -> dict[str, Any]:
    """Scored PLL rows as `variant_scores` joins them: each sequence's PLL by its text, or why there is none (a
    residue the model reads as its unknown token is not scored: its PLL would be the unknown token's)."""
    found: dict[str, Any] = {}
    for r in rows:
        if r[S.STATUS] != S.STATUS_OK:
            found[r[S.TEXT]] = r[S.ERROR]
        elif r[S.N_UNKNOWN]:
            found[r[S.TEXT]] = f"{r[S.N_UNKNOWN]} residue(s) are not in the model's alphabet (its unknown token)"
        else:
            found[r[S.TEXT]] = float(r[S.PLL])
    return found


def _why(error: Any) -> str:
    return error if isinstance(error, str) else "the sequence was not scored"


@dataclass(frozen=True)
class SiteOptions:
    """What changes a site table: whether the position is masked, the residues tabulated, and what becomes of a
    sequence longer than the model's window (`window`: read in windows; `error`: an error row, as `--long-texts`
    says for every command) and which windows (`windows`: the project's, of the model's full width centred on
    each site, or ProteinGym's, for its numbers; masked tables only, the only ones its script windows)."""

    masked: bool
    alphabet: str
    long_texts: str = "window"
    windows: str = option(
        "centred",
        "how masked-marginal reads a wild type longer than the model: centred (the default: windows of the model's "
        "full width, special tokens included, centred on each site) or proteingym (the tokens ProteinGym's ESM "
        "script slices around each site: get_optimal_window, special tokens counted and kept only at the ends)",
        later=True,
        choices=WINDOWS,
    )

    def __post_init__(self) -> None:
        if self.windows == "proteingym" and not self.masked:
            raise UserError(
                "ProteinGym's windows are those of its masked marginals (its script reads an unmasked long wild "
                "type whole): windows='proteingym' takes masked site tables only"
            )


class SitePreparer(Stage):
    """Residues to token ids, and the positions to score as targets; a residue outside the alphabet or a site
    outside the sequence makes an error row."""

    reads = {
        S.ID: "the sequence's key, kept",
        S.TEXT: "the sequence, one letter per residue",
        S.STATUS: "ok, or error for a row that could not be read",
        S.ERROR: "why the row could not be read",
        SITES: "the 0-based positions to tabulate, space-separated",
    }
    writes = pa.schema(
        S.READ_FIELDS
        + [
            pa.field(SITES, pa.string()),
            pa.field(S.INPUT_IDS, pa.list_(pa.int32())),
            pa.field(S.TARGETS, pa.list_(pa.int32())),
        ]
    )

    def __init__(self, vocabulary: ResidueVocabulary) -> None:
        self.vocabulary = vocabulary

    def process(self, rows: list[Row]) -> list[Row]:
        return [self._prepared(row) for row in rows]

    def _prepared(self, row: Row) -> Row:
        out = {**S.key(row), S.TEXT: row[S.TEXT], S.STATUS: row[S.STATUS], S.ERROR: row[S.ERROR], SITES: row[SITES]}
        out |= {S.INPUT_IDS: None, S.TARGETS: None}
        if row[S.STATUS] != S.STATUS_OK:
            return out
        sequence, ids = row[S.TEXT] or "", self.vocabulary.ids
        outside = sorted({r for r in sequence if r not in ids})
        sites = [int(s) for s in (row[SITES] or "").split()]
        error = (
            f"the residue(s) {''.join(outside)!r} are not in the model's alphabet ({self.vocabulary.alphabet})"
            if outside
            else "no site to score"
            if not sites
            else f"site {max(sites)} is outside the sequence of {len(sequence)} residues"
            if max(sites) >= len(sequence) or min(sites) < 0
            else None
        )
        if error is not None:
            return out | {S.STATUS: S.STATUS_ERROR, S.ERROR: error}
        prefix, suffix = list(self.vocabulary.prefix), list(self.vocabulary.suffix)
        out[S.INPUT_IDS] = prefix + [ids[r] for r in sequence] + suffix
        out[S.TARGETS] = [len(prefix) + s for s in sites]
        return out


class SiteScorer(Stage):
    """The table of each prepared row: log p(residue | sequence, the site masked or not) at its targets."""

    reads = {
        S.ID: "the sequence's key, kept",
        S.TEXT: "the sequence, kept (the workflow checks it against the id it joins by)",
        S.STATUS: "ok, or error for a row that could not be read or prepared",
        S.ERROR: "why",
        SITES: "the positions, kept",
        S.INPUT_IDS: "the token ids, specials included",
        S.TARGETS: "the token positions of the sites",
    }
    writes = pa.schema(
        [
            pa.field(S.ID, pa.string(), nullable=False),
            pa.field(S.TEXT, pa.string()),
            pa.field(S.STATUS, pa.string(), nullable=False),
            pa.field(S.ERROR, pa.string()),
            pa.field(POSITIONS, pa.list_(pa.int32())),
            pa.field(LOGPROBS, pa.list_(pa.float64())),
            pa.field(PASSES, pa.int64(), nullable=False),
            pa.field(S.MODEL, pa.string()),
        ]
    )

    def __init__(
        self,
        model: ModelSpec,
        options: SiteOptions,
        vocabulary: ResidueVocabulary,
        batch_tokens: int | None = None,
        mlm: MaskedLM | None = None,
    ) -> None:
        from ..engine.masked_lm import load_masked_lm
        from ..engine.variants import SiteEngine

        self.mlm = mlm or load_masked_lm(model)
        self.model_name = model.name
        self.options = options
        self.vocabulary = vocabulary
        self.columns = np.asarray([vocabulary.ids[r] for r in options.alphabet], dtype=np.int64)
        self.engine = SiteEngine(self.mlm, batch_tokens)
        self.signature = self.mlm.signature

    def process(self, rows: list[Row]) -> list[Row]:
        from ..engine.masking import Sentence

        ok = [i for i, r in enumerate(rows) if r[S.STATUS] == S.STATUS_OK]
        out = [self._row(row, None, 0) for row in rows]
        if self.options.long_texts == "error":
            for i in [i for i in ok if len(rows[i][S.INPUT_IDS]) > self.mlm.max_length]:
                out[i] = self._row(rows[i], _too_long(len(rows[i][S.INPUT_IDS]), self.mlm.max_length), 0)
            ok = [i for i in ok if len(rows[i][S.INPUT_IDS]) <= self.mlm.max_length]
        parts = {}  # row -> its windows, for the rows that can be read
        for i in ok:
            ids = np.asarray(rows[i][S.INPUT_IDS], np.int64)
            part = self._windows(Sentence(ids, np.asarray(rows[i][S.TARGETS], np.int64), np.full(len(ids), -1)))
            if isinstance(part, str):
                out[i] = self._row(rows[i], part, 0)
            else:
                parts[i] = part
        flat = [sentence for part in parts.values() for sentence, _ in part]
        table = self.engine.masked if self.options.masked else self.engine.unmasked
        results = iter(isolated(lambda batch: table(batch, self.columns, self.report), flat))
        for i, part in parts.items():
            got = [next(results) for _ in part]
            failed = next((g for g in got if isinstance(g, str)), None)
            if failed is not None:
                out[i] = self._row(rows[i], failed, 0)
                continue
            values = np.empty((len(rows[i][S.TARGETS]), len(self.columns)))
            for (_, slots), value in zip(part, got):
                values[slots] = value
            passes = sum(len(sentence.targets) if self.options.masked else 1 for sentence, _ in part)
            out[i] = self._row(rows[i], values, passes)
        return out

    def _windows(self, sentence: Sentence) -> list[tuple[Sentence, np.ndarray]] | str:
        """The sentence as the model can read it: itself, or, when longer than the model's window, the windows
        `engine.windows.split` gives its residues, those that hold a target, each with its targets and their
        indices among the sentence's (ProteinGym's instead, with `windows="proteingym"`); or why it has none
        (the row's error)."""
        from ..engine.masking import Sentence
        from ..engine.windows import split

        ids, targets = sentence.input_ids, sentence.targets
        if self.options.windows == "proteingym":
            return self._proteingym_windows(sentence)
        if len(ids) <= self.mlm.max_length:
            return [(sentence, np.arange(len(targets)))]
        first = len(self.vocabulary.prefix)
        residues = np.arange(first, len(ids) - len(self.vocabulary.suffix))
        slot_of = np.full(len(ids), -1)
        slot_of[targets] = np.arange(len(targets))
        parts = split(Sentence(ids, residues, sentence.piece_words), self.mlm.max_length, "original")
        if isinstance(parts, str):
            return parts
        windows = []
        for window in parts:
            wanted = slot_of[first + window.slots] >= 0  # the window's residues that are targets
            if wanted.any():
                w = window.sentence
                read = Sentence(w.input_ids, w.targets[wanted], w.piece_words)
                windows.append((read, slot_of[first + window.slots[wanted]]))
        return windows

    def _proteingym_windows(self, sentence: Sentence) -> list[tuple[Sentence, np.ndarray]]:
        """The sentence as ProteinGym slices it (`engine.windows.proteingym_window` of each target's token
        position, specials counted, in ProteinGym's 1024 tokens or the model's maximum if fewer): whole when it
        fits, else runs of its tokens, special or not, each with the targets whose window it is (their indices
        among the sentence's); targets that share a window share one."""
        from ..engine.masking import Sentence
        from ..engine.windows import PROTEINGYM_WIDTH, proteingym_window

        ids, targets = sentence.input_ids, sentence.targets
        width = min(self.mlm.max_length, PROTEINGYM_WIDTH)
        spans = [proteingym_window(int(t), len(ids), width) for t in targets]
        windows = []
        for start, end in dict.fromkeys(spans):
            slots = np.asarray([k for k, span in enumerate(spans) if span == (start, end)])
            read = Sentence(ids[start:end], targets[slots] - start, sentence.piece_words[start:end])
            windows.append((read, slots))
        return windows

    def _row(self, row: Row, values: np.ndarray | str | None, passes: int) -> Row:
        ok = isinstance(values, np.ndarray)
        error = values if isinstance(values, str) else row[S.ERROR]
        return {
            **S.key(row),
            S.TEXT: row[S.TEXT],
            S.STATUS: S.STATUS_OK if ok else S.STATUS_ERROR,
            S.ERROR: None if ok else error,
            POSITIONS: [int(s) for s in row[SITES].split()] if ok else None,
            LOGPROBS: values.ravel().tolist() if ok else None,
            PASSES: passes,
            S.MODEL: self.model_name,
        }


def _too_long(tokens: int, max_length: int) -> str:
    return (
        f"the sequence is {tokens} tokens long with special tokens, over the model's maximum of {max_length}: "
        "--long-texts window reads it in windows of the model's width"
    )


def site_workload(
    model: ModelSpec,
    masked: bool,
    vocabulary: ResidueVocabulary,
    batch_tokens: int | None = None,
    long_texts: str = "window",
    windows: str = "centred",
) -> Workload:
    """The site tables of `dscore variants`: masked (the masked marginal) or not (wild-type, mutant marginals)."""
    options = SiteOptions(masked, vocabulary.alphabet, long_texts, windows)
    return DECLARED.workload(
        options,
        partial(SitePreparer, vocabulary),
        partial(SiteScorer, model, options, vocabulary, batch_tokens),
        model.device,
    )


def tabulated(row: Row, alphabet: str) -> dict[int, np.ndarray]:
    """A scored row's table as {position: log-probabilities over the alphabet}."""
    values = np.asarray(row[LOGPROBS], dtype=np.float64).reshape(len(row[POSITIONS]), len(alphabet))
    return dict(zip(row[POSITIONS], values))
