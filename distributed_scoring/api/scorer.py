"""`MLMScorer`: masked-LM scores of texts in a notebook or a script, with one loaded model, no Ray and no files.

    >>> from distributed_scoring import MLMScorer
    >>> scorer = MLMScorer(model, device="cpu")  # a Hub id ("bert-base-cased") or a local folder
    >>> plls = scorer.pll(["The quick brown fox jumps over the lazy dog.", "She sells seashells."])
    >>> len(plls), all(p < 0 for p in plls)  # natural log, summed over each text's tokens
    (2, True)

It runs the stages `dscore score` runs (`workloads.prepare.PLLPreparer` tokenises, `workloads.pll.PLLScorer`
scores through `engine.pll.PLLEngine`, packed under the token budget), in this process, `CHUNK_ROWS`
texts at a time, so its numbers are the CLI's. Infilling, sampling and pairwise joints run their
workloads' stages the same way, on the same loaded model; chain-rule scoring runs `engine.chain` on
the PLL stages' tokenisation.

A text that cannot be scored (empty or blank, longer than the model takes, not a string) is never an
exception: `score` says why in its `status` and `error`; `pll` gives NaN for it and `token_score`,
`word_score` None, with one warning per call; `pppl` leaves it out of the sums, with the same warning.
Texts the tokenizer cannot read (English into a protein model: every token the unknown token) still
score; a call where they are many gives one `UnknownTokensWarning`, by the rule of the CLI's summary,
and `score` gives each text's `n_unknown`.
Mistakes that concern every text (an unknown model, device, dtype or variant; a single string where a
list is expected) raise `UserError` before any work.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..config import ModelSpec, ScoringOptions
from ..engine.joint_stats import CONSTRUCTIONS, JointOptions
from ..engine.orders import CHAIN_ORDERS, orders_for
from ..errors import UserError
from ..io import schema as S
from ..io.dms import refuse_repeats
from ..io.output import unknown_tokens
from ..io.sources import ok_row
from ..measures import pppl
from ..pipeline.aggregate import unknown_warnings
from ..pipeline.progress import Progress
from ..pipeline.stage import Row
from ..workloads.infill import InfillOptions, InfillPreparer, InfillScorer, example_seed
from ..workloads.infill import output_schema as infill_schema
from ..workloads.joints import CONSTRUCTION, JOINTS_SCHEMA, SCHEMES, A, B, JointsScorer, is_pair, with_pair
from ..workloads.pll import PLLScorer
from ..workloads.prepare import PLLPreparer, split_characters, whitespace_words
from ..workloads.sample import OUTPUT_SCHEMA, SampleOptions, SamplePreparer, SampleScorer
from ..workloads.variants import (
    SITES,
    STRATEGIES,
    ResidueVocabulary,
    SiteOptions,
    SitePreparer,
    SiteScorer,
    found_plls,
    found_tables,
    read_variant,
    residue_vocabulary,
    sequences,
    variant_scores,
)
from .naming import python_errors, python_names
from .rows import added_schema, public, read_rows

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

# Texts per pass through the stages: the CLI's default shard, so the engine packs as it does there; the
# progress bar moves once per chunk.
CHUNK_ROWS = 1000
# Examples per pass for pairwise joints (2|V| forward passes each): the joints command's shard.
JOINT_CHUNK_ROWS = 50
Step = Callable[[list[Row]], list[Row]]


class UnknownTokensWarning(UserWarning):
    """Many of a call's texts are mostly the tokenizer's unknown token: the model cannot read them (text
    that does not suit the model, or protein sequences written without spaces), so their scores say little."""


def _warn_unscored(rows: list[Row], instead: str) -> None:
    failed = [row for row in rows if row[S.STATUS] != S.STATUS_OK]
    if failed:
        logger.warning(
            "%d of %d texts could not be scored and give %s (the first: %s); "
            "MLMScorer.score gives each text's status and error",
            len(failed),
            len(rows),
            instead,
            failed[0][S.ERROR],
        )


def _warn_unknown(rows: list[Row]) -> None:
    """One `UnknownTokensWarning` for a call whose texts the tokenizer cannot read, by the rule and in the
    words of `dscore score`'s summary (`pipeline.aggregate.unknown_warnings`), its flags as keyword arguments."""
    counts = pa.table({name: [row[name] for row in rows] for name in (S.STATUS, S.N_TOKENS, S.N_UNKNOWN)})
    _, mostly_unknown = unknown_tokens(counts)
    ok = sum(row[S.STATUS] == S.STATUS_OK for row in rows)
    for message in unknown_warnings(mostly_unknown, ok):
        # The caller of the public method: this function, the method, `python_errors`, then the caller.
        warnings.warn(python_names(message), UnknownTokensWarning, stacklevel=4)


class MLMScorer:
    """One masked LM, loaded once, and the scores of lists of texts.

    `model` is a Hub id or a local folder (a string or a path; see `ModelSpec`); `device` one of
    `config.DEVICES` or `cuda:N` (`auto`: CUDA when present); `dtype` one of `config.DTYPES` (`auto`:
    bfloat16 autocast on CUDA, float32 on CPU; `bfloat16`/`float16`: weights in that dtype; the log-softmax
    stays in float32). `variant`
    is the PLL's masking (`original`, or `word_l2r`); `batch_tokens` bounds rows x padded length of one
    forward pass (None: the device's default); `split_chars` reads each text as space-separated
    characters (per-residue protein models). `progress` shows a bar per call, moving every `CHUNK_ROWS`
    texts. `long_texts` (`window` or `error`): a text longer than the model's maximum is scored in windows
    of the model's width (`engine.windows`; its row says `windowed`) or is an error row, as with
    `dscore score --long-texts`; `joints` and `chain` never window.

        >>> scorer = MLMScorer(model, device="cpu", variant="word_l2r")
        >>> scorer.signature["model"] == model, scorer.signature["device"]
        (True, 'cpu')
    """

    @python_errors
    def __init__(
        self,
        model: str | os.PathLike,
        device: str = "auto",
        dtype: str = "auto",
        variant: str = "original",
        batch_tokens: int | None = None,
        revision: str | None = None,
        trust_remote_code: bool = False,
        split_chars: bool = False,
        progress: bool = False,
        long_texts: str = "window",
    ) -> None:
        from ..engine.masked_lm import load_masked_lm

        self.spec = ModelSpec(os.fspath(model), revision, device, dtype, trust_remote_code)
        # Every optional column is computed (a small cost beside the forward passes); calls pick theirs.
        self.options = ScoringOptions(
            variant, batch_tokens, per_token=True, word_scores=True, split_chars=split_chars, long_texts=long_texts
        )
        self.mlm = load_masked_lm(self.spec)
        self.progress = progress
        self.preparer = PLLPreparer(self.mlm.tokenizer, self.mlm.max_length, split_chars)  # joints, chain: no windows
        self.pll_preparer = PLLPreparer(self.mlm.tokenizer, self.mlm.max_length, split_chars, long_texts)
        self.scorer = PLLScorer(self.spec, self.options, self.mlm)
        self._site_scorers: dict[bool, SiteScorer] = {}  # `variants`' site tables: masked, or not
        self._site_cache: dict[tuple[bool, str], dict[int, np.ndarray]] = {}  # (masked, wild type) -> its positions

    @property
    def signature(self) -> dict:
        """What the scores depend on: model, revision, architecture, dtype, device, versions..."""
        return {**self.mlm.signature, "variant": self.options.variant, "split_chars": self.options.split_chars}

    def __repr__(self) -> str:
        return (
            f"MLMScorer({self.spec.name!r}, device={self.mlm.device.type!r}, "
            f"dtype={self.signature['dtype']!r}, variant={self.options.variant!r})"
        )

    # PLL and what follows from it.

    @python_errors
    def score(self, texts: Sequence[str], per_token: bool = False, word_scores: bool = False) -> list[dict]:
        """One dict per text with `dscore score`'s columns: text, pll, n_tokens, n_words, n_unknown,
        pppl_token, pppl_word, status, error, and with `per_token` tokens and token_logprobs, with
        `word_scores` word_scores (per whitespace word, summed over its pieces). A text that cannot be
        scored has status `error`, the reason in `error`, and null scores.

            >>> rows = scorer.score(["the quick brown fox", ""])
            >>> rows[0]["status"], rows[0]["n_words"], rows[0]["pll"] < 0
            ('ok', 4, True)
            >>> rows[1]["status"], rows[1]["error"], rows[1]["pll"]
            ('error', 'empty or whitespace-only text', None)
        """
        rows = self._scored(texts, self.progress)
        _warn_unknown(rows)
        return [public(row, [S.TEXT, *added_schema(per_token, word_scores).names]) for row in rows]

    @python_errors
    def pll(self, texts: Sequence[str]) -> list[float]:
        """The pseudo-log-likelihood of each text (natural log, summed over its non-special tokens);
        NaN where a text cannot be scored (see `score` for why).

            >>> plls = scorer.pll(["the quick brown fox", "   "])
            >>> plls[0] < 0, math.isnan(plls[1])
            (True, True)
        """
        rows = self._scored(texts, self.progress)
        _warn_unscored(rows, "NaN")
        _warn_unknown(rows)
        return [row[S.PLL] if row[S.STATUS] == S.STATUS_OK else math.nan for row in rows]

    @python_errors
    def token_score(self, texts: Sequence[str]) -> list[list[tuple[str, float]] | None]:
        """Per text, (token, log-probability) of each scored token, as minicons' `token_score` gives
        them; their sum is the PLL. None where a text cannot be scored.

            >>> scorer.token_score(["the fox"])  # the tiny test vocabulary splits "fox"  # doctest: +ELLIPSIS
            [[('the', -...), ('fo', -...), ('##x', -...)]]
        """
        rows = self._scored(texts, self.progress)
        _warn_unscored(rows, "None")
        _warn_unknown(rows)
        return [
            list(zip(row[S.TOKENS], row[S.TOKEN_LOGPROBS])) if row[S.STATUS] == S.STATUS_OK else None for row in rows
        ]

    @python_errors
    def word_score(self, texts: Sequence[str]) -> list[list[tuple[str, float]] | None]:
        """Per text, (word, log-probability) of each whitespace-separated word, the sum over its tokens
        (minicons' `word_score`); a word's punctuation stays with it. None where a text cannot be scored.

            >>> scorer.word_score(["the lazy dog."])  # doctest: +ELLIPSIS
            [[('the', -...), ('lazy', -...), ('dog.', -...)]]
        """
        rows = self._scored(texts, self.progress)
        _warn_unscored(rows, "None")
        _warn_unknown(rows)
        return [
            list(zip(self._words(row[S.TEXT]), row[S.WORD_SCORES])) if row[S.STATUS] == S.STATUS_OK else None
            for row in rows
        ]

    @python_errors
    def pppl(self, texts: Sequence[str], per: str = "token") -> float:
        """Corpus pseudo-perplexity exp(-sum PLL / sum N), N the scored tokens (`per="token"`) or the
        whitespace words (`per="word"`), over the texts that can be scored (never a mean of per-text
        perplexities); NaN when none can.

            >>> scorer.pppl(["the quick brown fox", "the lazy dog"]) > 1
            True
        """
        counts = {"token": S.N_TOKENS, "word": S.N_WORDS}
        if per not in counts:
            raise UserError(f"per must be 'token' or 'word', got {per!r}")
        rows = self._scored(texts, self.progress)
        _warn_unscored(rows, "no terms to the sums")
        _warn_unknown(rows)
        ok = [row for row in rows if row[S.STATUS] == S.STATUS_OK]
        value = pppl(math.fsum(row[S.PLL] for row in ok), sum(row[counts[per]] for row in ok))
        return math.nan if value is None else value

    @python_errors
    def score_table(
        self, texts: Sequence[object], per_token: bool = False, word_scores: bool = False, prefix: str = ""
    ) -> pa.Table:
        """The columns of `added_schema` for the texts, as one Arrow table in their order: what
        `PLLStage` and `score_dataset` add to a batch."""
        rows = self._scored(texts, progress=False, chunk=max(len(texts), 1))  # the caller's batch, whole
        _warn_unknown(rows)
        schema = added_schema(per_token, word_scores)
        return pa.Table.from_pylist(
            [{prefix + name: row[name] for name in schema.names} for row in rows],
            schema=added_schema(per_token, word_scores, prefix),
        )

    @python_errors
    def score_dataset(
        self,
        dataset: Dataset,
        text_column: str = "text",
        per_token: bool = False,
        word_scores: bool = False,
        prefix: str = "",
        batch_size: int = CHUNK_ROWS,
    ) -> Dataset:
        """A Hugging Face `datasets.Dataset` (each split of a `DatasetDict`, or an `IterableDataset`, lazily)
        with the columns of `added_schema` after its own, rows in the same order; see `score`.

            >>> from datasets import Dataset
            >>> scored = scorer.score_dataset(Dataset.from_dict({"text": ["the quick brown fox", ""]}))
            >>> scored.column_names[:4], scored[1]["status"], scored[1]["error"]
            (['text', 'pll', 'n_tokens', 'n_words'], 'error', 'empty or whitespace-only text')

        It is `Dataset.map` in batches, reading only the text column, with the added columns' features given
        up front (so a batch where every row failed keeps their types). The model stays in this process, so
        there is no `num_proc`: parallel scoring of a large corpus is `dscore score --ray` or `PLLStage`. The
        map is fingerprinted from the input's fingerprint, the scorer's signature and the options (hashing the
        model itself would take long), and never loaded from the cache: a local model folder may change under
        the same name, so the scores are always computed.
        """
        from datasets import DatasetDict, Features, IterableDataset, IterableDatasetDict
        from datasets.fingerprint import Hasher

        if isinstance(dataset, (DatasetDict, IterableDatasetDict)):
            return type(dataset)(
                {
                    split: self.score_dataset(part, text_column, per_token, word_scores, prefix, batch_size)
                    for split, part in dataset.items()
                }
            )
        added = added_schema(per_token, word_scores, prefix)
        columns = dataset.column_names
        if columns is not None:  # an IterableDataset may not know its columns before it is read
            if text_column not in columns:
                raise UserError(
                    f"the dataset has no text column {text_column!r}; its columns are {columns}: pass text_column="
                )
            clash = [name for name in added.names if name in columns]
            if clash:
                raise UserError(
                    f"the dataset already has columns {clash}: pass prefix= (prefix='mlm_' adds mlm_pll, ...)"
                )
        new = Features.from_arrow_schema(added)
        features = Features({**dataset.features, **new}) if dataset.features is not None else None

        def add(texts: list) -> dict:
            return self.score_table(texts, per_token, word_scores, prefix).to_pydict()

        options = dict(batched=True, batch_size=batch_size, input_columns=[text_column], features=features)
        if isinstance(dataset, IterableDataset):
            return dataset.map(add, **options)
        fingerprint = Hasher.hash([dataset._fingerprint, self.signature, text_column, per_token, word_scores, prefix])
        return dataset.map(add, new_fingerprint=fingerprint, load_from_cache_file=False, desc="scoring", **options)

    # The other workloads, on the same model.

    @python_errors
    def infill(
        self,
        texts: Sequence[str],
        answers: Sequence[object] | None = None,
        ids: Sequence[object] | None = None,
        **options: Any,
    ) -> list[dict]:
        """Fill the mask tokens of each text (`dscore infill`): one dict per text with the CLI's columns
        (best, beams: the fills best first with their tokens, text and score, n_masks, status, error;
        with `answers`, rank and correct_tokens). `options` are the fields of
        `workloads.infill.InfillOptions` (decoder, order, beam, top, vocab_restrict, pivot, temperature,
        sample_top_k, top_p, seed, max_masks, exact_limit, rescore_pll). Samplers draw from (seed, id):
        pass the CLI's `ids` to get its fills.

            >>> mask = scorer.mlm.tokenizer.mask_token
            >>> row = scorer.infill([f"the quick {mask} fox"], beam=3)[0]
            >>> row["status"], len(row["beams"]), row["best"] == row["beams"][0]["text"]
            ('ok', 3, True)
        """
        settings = InfillOptions(**_tuples(options))
        preparer = InfillPreparer(self.spec, settings)
        scorer = InfillScorer(self.spec, settings, self.options.batch_tokens, self.mlm)
        rows = read_rows(texts, ids, answers, settings.answer_column)
        names = infill_schema(settings).names
        return [public(row, names) for row in self._run(rows, [preparer.process, scorer.process], CHUNK_ROWS)]

    @python_errors
    def sample(
        self,
        texts: Sequence[str],
        answers: Sequence[object] | None = None,
        ids: Sequence[object] | None = None,
        **options: Any,
    ) -> list[list[dict]]:
        """Metropolis-Hastings chains from the model's energy (`dscore sample`), started from each text
        (mask tokens mark the positions to sample): per text, the CLI's rows, one per chain and recorded
        epoch (chain, epoch, text, energy_raw, energy_norm, proposals, accepted, novel, status, ...).
        `options` are the fields of `workloads.sample.SampleOptions` (energy, sampler, epochs, burn_in,
        chains, seed, free_all, block, ...); chains draw from (seed, id, chain).

            >>> mask = scorer.mlm.tokenizer.mask_token
            >>> rows = scorer.sample([f"the {mask} fox"], epochs=3, chains=2)[0]
            >>> [(r["chain"], r["epoch"]) for r in rows]
            [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
        """
        settings = SampleOptions(**_tuples(options))
        preparer = SamplePreparer(self.spec, settings)
        scorer = SampleScorer(self.spec, settings, self.options.batch_tokens, self.mlm)
        rows = self._run(
            read_rows(texts, ids, answers, settings.answer_column), [preparer.process, scorer.process], CHUNK_ROWS
        )
        per_text = settings.chains * settings.records
        return [
            [public(row, OUTPUT_SCHEMA.names) for row in rows[start : start + per_text]]
            for start in range(0, len(rows), per_text)
        ]

    @python_errors
    def joints(
        self,
        texts: Sequence[str],
        pairs: Sequence[tuple[int, int] | None] | None = None,
        scheme: str = "random",
        seed: int = 0,
        ids: Sequence[object] | None = None,
        pivot: str | int = "mode",
        ag_iterations: int = 50,
        top_k: int | None = None,
    ) -> list[dict[str, dict]]:
        """Pairwise joints of two tokens per text (`dscore joints`, Torroba-Hennigen et al., 2023): per
        text, construction (MLM, MRF, MRF-L, HCB, AG) -> the CLI's row (a, b, token_a, token_b,
        log_pair, log_unary_a, log_unary_b, a_kl, g_kl, ag_change, status, error).

        `pairs` gives each text's (a, b), 0-based indices of its non-special tokens (None: drawn);
        without it every pair is drawn by `scheme` (`random`, `contiguous`) from (seed, id). Exact joints
        hold |V| x |V| tables: `top_k` restricts both tokens to the gold and top-k candidates (needed for
        real vocabularies on most machines), `pivot` and `ag_iterations` as `engine.joint_stats.JointOptions`.

            >>> rows = scorer.joints(["the quick brown fox"], pairs=[(0, 2)], top_k=5)[0]
            >>> sorted(rows), rows["HCB"]["a"], rows["HCB"]["b"], rows["HCB"]["log_pair"] < 0
            (['AG', 'HCB', 'MLM', 'MRF', 'MRF-L'], 0, 2, True)
        """
        if scheme not in SCHEMES:
            raise UserError(f"scheme {scheme!r} is not one of {SCHEMES}")
        rows = read_rows(texts, ids)
        given = [None] * len(rows) if pairs is None else list(pairs)
        if len(given) != len(rows):
            raise UserError(f"pairs must be one per text (None to draw one): got {len(given)} for {len(rows)} texts")
        examples = {row[S.ID]: _example(pair) for row, pair in zip(rows, given)}
        scorer = JointsScorer(self.spec, JointOptions(pivot, ag_iterations), self.options.batch_tokens, top_k, self.mlm)

        def paired(part: list[Row]) -> list[Row]:
            return [with_pair(row, examples[row[S.ID]], scheme, seed) for row in part]

        out = self._run(rows, [self.preparer.process, paired, scorer.process], JOINT_CHUNK_ROWS)
        per_text = len(CONSTRUCTIONS)
        return [
            {row[CONSTRUCTION]: public(row, JOINTS_SCHEMA.names) for row in out[start : start + per_text]}
            for start in range(0, len(out), per_text)
        ]

    @python_errors
    def chain(
        self,
        texts: Sequence[str],
        order: str = "l2r",
        orders: int = 1,
        seed: int = 0,
        ids: Sequence[object] | None = None,
    ) -> list[dict]:
        """Chain-rule log-likelihoods along orders of each text's tokens (Liao et al., 2020, u-PMLM;
        `engine.chain`): log p(x) = sum_k log p(x_s(k) | x_s(<k), the later positions of the order masked).
        `order` is `l2r` or `r2l` (one order each) or `random` (`orders` permutations, drawn from (seed,
        id)). Per text: `logp`, one per order; `orders`, each as 0-based indices of the text's non-special
        tokens; `n_tokens`, `n_unknown` (as in `score`), `status`, `error` (texts that cannot be scored as
        in `score`). For an MLM not trained as a u-PMLM the sum depends on the order and only
        approximates a likelihood.

            >>> row = scorer.chain(["the quick brown fox"], order="random", orders=3, seed=1)[0]
            >>> len(row["logp"]), sorted(row["orders"][0]) == list(range(row["n_tokens"])), row["status"]
            (3, True, 'ok')
        """
        from ..engine.chain import ChainEngine

        if order not in CHAIN_ORDERS:
            raise UserError(f"order {order!r} is not one of {CHAIN_ORDERS}")
        if orders < 1 or (order != "random" and orders != 1):
            raise UserError(f"orders={orders}: `random` takes one or more orders, `{order}` has exactly one")
        engine = ChainEngine(self.mlm, self.options.batch_tokens)

        def chained(part: list[Row]) -> list[Row]:
            ok = [row for row in part if row[S.STATUS] == S.STATUS_OK]
            drawn = {
                row[S.ID]: orders_for(
                    np.asarray(row[S.TARGETS]), order, orders, np.random.default_rng(example_seed(seed, row[S.ID]))
                )
                for row in ok
            }
            sequences = [np.asarray(row[S.INPUT_IDS]) for row in ok for _ in drawn[row[S.ID]]]
            logps = iter(engine.log_likelihoods(sequences, [o for row in ok for o in drawn[row[S.ID]]]).tolist())
            return [_chain_row(row, drawn.get(row[S.ID]), logps) for row in part]

        rows = self._run(read_rows(texts, ids), [self.preparer.process, chained], CHUNK_ROWS)
        _warn_unknown(rows)
        return rows

    @python_errors
    def variants(
        self,
        mutants: Sequence[str | None],
        target_seq: str,
        strategy: str = "masked-marginal",
        offset: int = 1,
        mutated_sequences: Sequence[str | None] | None = None,
    ) -> list[dict]:
        """Variant effects of the `mutants` of the wild type `target_seq` (`dscore variants`, Meier et al., 2021):
        one dict per mutant (a name such as "A23G:K45R", positions numbered from `offset`) with its score, the sum
        over its sites of log p(mutant residue) - log p(wild-type residue) by the `strategy` (wt-marginal,
        masked-marginal, mutant-marginal; or pll: PLL(mutant) - PLL(wild type)), n_mutations, status and error.
        `mutated_sequences` (with `pll`) score indels that no substitution names. A wild type's site table is
        computed once and kept: later calls on the same wild type reuse the positions already tabulated.

            >>> before = protein_scorer.site_passes
            >>> rows = protein_scorer.variants(["K2R", "K2R:T3S", "Q9X9"], "MKTAYIAKQRQISFVKSHFSRQ")
            >>> [r["n_mutations"] for r in rows], rows[2]["status"]
            ([1, 2, None], 'error')
            >>> protein_scorer.site_passes - before  # positions 2 and 3 of the wild type, each masked once
            2
        """
        if strategy not in STRATEGIES:
            raise UserError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        mutants, target = list(mutants), target_seq.strip().upper()
        given = [None] * len(mutants) if mutated_sequences is None else list(mutated_sequences)
        if len(given) != len(mutants):
            raise UserError(f"mutated_sequences must be one per mutant: got {len(given)} for {len(mutants)}")
        vocabulary = residue_vocabulary(self.mlm.tokenizer, self.spec.name, strategy, target)
        read = [read_variant(m, g, target, strategy, offset, vocabulary) for m, g in zip(mutants, given)]
        refuse_repeats([v.key for v in read], "the mutants given")
        columns = sequences([("wild type", target, read)], strategy)
        if strategy == "pll":
            preparer = PLLPreparer(self.mlm.tokenizer, self.mlm.max_length, True, self.options.long_texts)
            rows = self._run(read_rows(columns[S.TEXT]), [preparer.process, self.scorer.process], CHUNK_ROWS)
            found = found_plls(rows)
        else:
            found = self._site_tables(columns, vocabulary, strategy)
        scores = variant_scores("wild type", target, read, strategy, found, vocabulary.alphabet if vocabulary else "")
        return [
            {
                "mutant": m,
                "score": score,
                "n_mutations": len(v.sites) if v.sites and error is None else None,
                S.STATUS: S.STATUS_OK if error is None else S.STATUS_ERROR,
                S.ERROR: error,
            }
            for m, v, (score, error) in zip(mutants, read, scores)
        ]

    @property
    def site_passes(self) -> int:
        """The sequences `variants` has run through the model for site tables (masked copies, unmasked passes)."""
        return sum(s.engine.passes for s in self._site_scorers.values())

    def _site_tables(self, columns: dict[str, list], vocabulary: ResidueVocabulary, strategy: str) -> dict[str, Any]:
        """The site tables `variant_scores` joins by key; a wild type's positions tabulated by an earlier call are
        taken from the cache, only the others computed."""
        masked = strategy == "masked-marginal"
        scorer = self._site_scorers.get(masked)
        if scorer is None:
            options = SiteOptions(masked, vocabulary.alphabet)
            scorer = SiteScorer(self.spec, options, vocabulary, self.options.batch_tokens, self.mlm)
            self._site_scorers[masked] = scorer
        keep = strategy != "mutant-marginal"  # a mutant's own table serves no later call
        rows = []
        for key, text, sites in zip(columns[S.ID], columns[S.TEXT], columns[SITES]):
            cached = self._site_cache.get((masked, text), {}) if keep else {}
            todo = [p for p in map(int, sites.split()) if p not in cached]
            rows.append({**ok_row(key, text), SITES: " ".join(map(str, todo))} if todo else None)
        todo_rows = [r for r in rows if r is not None]
        scored = (
            self._run(todo_rows, [SitePreparer(vocabulary).process, scorer.process], CHUNK_ROWS) if todo_rows else []
        )
        found: dict[str, Any] = found_tables(scored, vocabulary.alphabet)
        for key, text in zip(columns[S.ID], columns[S.TEXT]):
            table = found.get(key)
            if keep and isinstance(table, dict):
                self._site_cache.setdefault((masked, text), {}).update(table)
            if keep and not isinstance(table, str):
                found[key] = self._site_cache.get((masked, text), {})
        return found

    # Plumbing.

    def _scored(self, texts: Sequence[object], progress: bool, chunk: int = CHUNK_ROWS) -> list[Row]:
        """The PLL stages' output rows of the texts, in order (prepared columns included)."""
        return self._run(read_rows(texts), [self.pll_preparer.process, self.scorer.process], chunk, progress)

    def _run(self, rows: list[Row], steps: Sequence[Step], chunk: int, progress: bool | None = None) -> list[Row]:
        """The rows through the steps, `chunk` input rows at a time, with a progress bar if asked."""
        bar = Progress(len(rows), "texts", bar=True) if (self.progress if progress is None else progress) else None
        out: list[Row] = []
        try:
            for start in range(0, len(rows), chunk):
                part = rows[start : start + chunk]
                for step in steps:
                    part = step(part)
                out += part
                if bar is not None:
                    bar.finished(str(start), min(chunk, len(rows) - start))
        finally:
            if bar is not None:
                bar.close()
        return out

    def _words(self, text: str) -> list[str]:
        """The whitespace words of a text as the tokenizer read it (the unit of `word_scores`)."""
        read = split_characters(text) if self.options.split_chars else text
        return [read[start:end] for start, end in whitespace_words(read)]


def _chain_row(row: Row, drawn: list[np.ndarray] | None, logps: Iterator[float]) -> dict:
    """A prepared row's chain scores (the next `len(drawn)` of `logps`), or its error."""
    if drawn is None:
        return {
            S.TEXT: row[S.TEXT],
            "logp": None,
            "orders": None,
            S.N_TOKENS: 0,
            S.N_UNKNOWN: 0,
            S.STATUS: S.STATUS_ERROR,
            S.ERROR: row[S.ERROR],
        }
    targets = np.asarray(row[S.TARGETS])
    return {
        S.TEXT: row[S.TEXT],
        "logp": [next(logps) for _ in drawn],
        "orders": [np.searchsorted(targets, o).tolist() for o in drawn],
        S.N_TOKENS: len(targets),
        S.N_UNKNOWN: row[S.N_UNKNOWN],
        S.STATUS: S.STATUS_OK,
        S.ERROR: None,
    }


def _example(pair: object) -> Row:
    """A given pair as the joints stages take it (`a`, `b`, `error`); None: drawn."""
    if pair is None:
        return {A: None, B: None, S.ERROR: None}
    if isinstance(pair, (tuple, list)) and len(pair) == 2 and is_pair(*pair):
        return {A: int(pair[0]), B: int(pair[1]), S.ERROR: None}
    return {A: None, B: None, S.ERROR: f"pair {pair!r} is not two different token indices >= 0"}


def _tuples(options: dict[str, Any]) -> dict[str, Any]:
    """Options as the frozen options dataclasses take them: lists (a vocabulary restriction) as tuples."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in options.items()}
