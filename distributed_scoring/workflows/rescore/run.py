"""Bulk N-best rescoring end to end (`dscore rescore`): each unique hypothesis text is scored once, through
the same sharded pipeline as `dscore score` (in this process or on Ray), then combined and tuned.

Layout of the output folder DIR (held, locked, from the first byte to the last):
    DIR/_run.json                what the run is (its inputs and models), and what it wrote
    DIR/texts/texts.parquet      the unique hypothesis texts to score (sorted; id = their position)
    DIR/mlm/                     the masked LM's scoring run over them (rows/, summary.json, resumable)
    DIR/maskless/                instead, with method `maskless`: a maskless student's predicted PLLs
    DIR/unmasked/                instead, with method `unmasked`: the masked LM's one-pass scores
    DIR/causal/                  the causal LM's run, when one is given
    DIR/hypotheses.parquet, DIR/best.parquet, DIR/{dev,test}.best.txt, DIR/report.json, DIR/report.md
    DIR/test.rescored.<ending>   the test list written back in its own format (a folder for ESPnet2, Kaldi)
Rerunning the same command after a crash resumes the LM runs and redoes the cheap combination. Scores
are joined to the hypotheses by id, and each row's text is checked against its hypothesis.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import pyarrow as pa

from ...config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ...errors import UserError
from ...io import schema as S
from ...io.claim import claim
from ...io.nbest import NBEST_FORMATS, read_nbest, require_references, resolve_format, unique_texts
from ...io.nbest_formats import FormatOptions
from ...io.output import OutputDir
from ...options import by_name, carried, check, option
from ...pipeline import runner
from ...workloads.causal import causal_workload
from ..maskless import score_maskless, score_unmasked
from ..score import score
from .combine import TextScore, text_scores
from .outputs import OUTPUT_FILES, Rescored, TestList, best_text_order, write_outputs
from .rescoring import rescore
from .search import RescoreOptions

logger = logging.getLogger(__name__)

TEXTS = "texts/texts.parquet"
RESCORE = "rescore"  # the workload of DIR/_run.json
MLM, MASKLESS, UNMASKED, CAUSAL = "mlm", "maskless", "unmasked", "causal"  # the LM runs' sub-folders
# How the masked-LM score of a hypothesis is had (`method`), and the sub-folder its scoring run writes.
SCORERS = {"pll": (MLM, score), "maskless": (MASKLESS, score_maskless), "unmasked": (UNMASKED, score_unmasked)}
# RescoreInputs' format options at their defaults (left out of the fingerprint).
FORMAT_DEFAULTS = {"fmt": "auto", "kaldi_acwt": 1.0, "beam_size": None}
# What an earlier dscore's rescore folder held, without a _run.json of its own (its LM runs had theirs).
EARLIER_LAYOUT = ("texts", MLM, MASKLESS, CAUSAL, *OUTPUT_FILES)


class MixedRowsError(UserError):
    """An LM run's folder holds rows whose text is not the hypothesis their id names."""


@dataclass(frozen=True)
class RescoreInputs:
    """The N-best lists, optional separate references, the output folder.

    `fmt` is the lists' format (`nbest.NBEST_FORMATS`, `auto` told by content); `kaldi_acwt` and
    `beam_size` say what Kaldi's and NeMo's lists cannot (`nbest_formats.FormatOptions`, whose fields they
    carry by name). `append` is added to every hypothesis before the LMs score it (the paper appends "." to
    ASR hypotheses, appendix A.2); scores stay keyed by the original text. The fields that are flags of
    `dscore rescore` declare them; the lists, the folder and `shard_rows` come from its other flags.
    """

    dev: str
    test: str
    output: str
    dev_refs: str | None = option(
        None,
        "references of the dev set, if not in the N-best file: JSONL/Parquet (utt_id, ref), TSV, mlm-scoring "
        "JSON, or text (one line per utterance in id order, or Kaldi-style `utt_id ref`)",
    )
    test_refs: str | None = option(None, "references of the test set, if not in the N-best file")
    append: str = option("", "text appended to each hypothesis before LM scoring ('.' for ASR)")
    shard_rows: int = 1000
    fmt: str = option(
        "auto",
        "format of --dev and --test (default auto: told by content; refused when it cannot be told)",
        choices=NBEST_FORMATS,
        name="--format",
    )
    kaldi_acwt: float = carried(FormatOptions, "kaldi_acwt")
    beam_size: int | None = carried(FormatOptions, "beam_size")

    def __post_init__(self) -> None:
        check(self)

    @property
    def formats(self) -> FormatOptions:
        """What the lists' formats cannot say for themselves."""
        return by_name(FormatOptions, self)


def rescore_nbest(
    inputs: RescoreInputs,
    model: ModelSpec | None,
    causal_model: ModelSpec | None,
    scoring: ScoringOptions,
    options: RescoreOptions,
    ray: RayOptions | None = None,
    overwrite: bool = False,
    method: str = "pll",
) -> Rescored:
    """Check every model loads, read, score the unique texts with each LM, tune on dev, apply to test,
    write the outputs. `method` says what stands for the masked LM's score: its PLL, a maskless student's
    predicted PLL (`maskless`: `model` is the student folder from `dscore train maskless`), or its
    one-pass score of the unmasked text (`unmasked`). The folder is held from before the texts are written
    until the reports are, its LM runs claiming their sub-folders inside it."""
    formats = inputs.formats
    check_models(model, causal_model, method)
    dev_fmt = resolve_format(inputs.dev, inputs.fmt)
    dev = _read(inputs.dev, inputs.dev_refs, "dev", dev_fmt, formats)
    test_fmt = resolve_format(inputs.test, inputs.fmt)
    test = _read(inputs.test, inputs.test_refs, "test", test_fmt, formats)
    _refuse_empty({"--dev": (inputs.dev, dev), "--test": (inputs.test, test)})
    texts = unique_texts(dev, test)
    logger.info("%d + %d hypotheses, %d unique texts", dev.num_rows, test.num_rows, len(texts))
    scored = [t + inputs.append for t in texts]
    sources = [p for p in (inputs.dev, inputs.test, inputs.dev_refs, inputs.test_refs) if p]
    lm_folder, scorer = SCORERS[method]
    run = _fingerprint(inputs, model, causal_model, method)
    with claim(inputs.output, sources, [m.name for m in (model, causal_model) if m]) as folder:
        folder.begin(
            run,
            folder.admit(run, overwrite, earlier=EARLIER_LAYOUT),
            [TEXTS, *([lm_folder] if model else []), *([CAUSAL] if causal_model else []), *OUTPUT_FILES],
        )
        started = time.monotonic()
        texts_file = folder.write_table(
            TEXTS, pa.table({S.ID: [f"{i:09d}" for i in range(len(texts))], S.TEXT: scored})
        )
        corpus = InputSpec((texts_file,), id_column=S.ID, shard_rows=inputs.shard_rows)
        mlm = causal = None
        if model is not None:
            config = RunConfig(corpus, model, scoring, folder.subfolder(lm_folder))
            scorer(config, ray, overwrite)
            mlm = _scores(config.output, texts, scored, S.PLL, "masked LM")
        if causal_model is not None:
            config = RunConfig(corpus, causal_model, scoring, folder.subfolder(CAUSAL))
            runner.run(config, causal_workload(causal_model, scoring.batch_tokens), ray, overwrite)
            causal = _scores(config.output, texts, scored, S.LOGP, "causal LM")
        seconds = time.monotonic() - started
        result = rescore(dev, test, mlm, causal, options)
        result.report["best_text_order"] = best_text_order({"dev": dev_fmt, "test": test_fmt})
        result.report["scoring"] = _scoring_figures(dev.num_rows + test.num_rows, len(texts), seconds)
        write_outputs(result, folder, TestList(inputs.test, test_fmt, test, inputs.kaldi_acwt))
    return result


def _fingerprint(inputs: RescoreInputs, model: ModelSpec | None, causal_model: ModelSpec | None, method: str) -> dict:
    """What the folder's run depends on: the inputs (not the folder itself), the models and the method.
    The format options are left out at their defaults, which read every list an earlier dscore read as it
    did, so that such a folder resumes."""
    fields = {k: v for k, v in asdict(inputs).items() if k != "output"}
    return {
        "workload": RESCORE,
        **{k: v for k, v in fields.items() if k not in FORMAT_DEFAULTS or v != FORMAT_DEFAULTS[k]},
        "model": model.name if model else None,
        "causal_model": causal_model.name if causal_model else None,
        "method": method,
    }


def _scoring_figures(hypotheses: int, unique_texts: int, seconds: float) -> dict:
    """The report's scoring section: how many texts the LMs scored, and how fast."""
    return {
        "hypotheses": hypotheses,
        "unique_texts": unique_texts,
        "seconds": round(seconds, 3),
        "hypotheses_per_s": round(hypotheses / max(seconds, 1e-9), 2),
        "unique_texts_per_s": round(unique_texts / max(seconds, 1e-9), 2),
        "note": "each distinct hypothesis text is scored once per LM; a resumed run counts only what it scored",
    }


def check_models(model: ModelSpec | None, causal_model: ModelSpec | None, method: str = "pll") -> None:
    """Every model the run needs loads its configuration and tokenizer (a student its maskless.json too),
    before any scoring: a bad `--causal-model` must not wait for the whole masked-LM pass to fail."""
    from ...engine.causal import load_causal_parts
    from ...engine.model_files import check_student_tokenizer, load_tokenizer, read_student_info

    if model is not None:
        tokenizer, _ = load_tokenizer(model)
        if method == "maskless":
            check_student_tokenizer(model.name, read_student_info(model.name), tokenizer)
    if causal_model is not None:
        load_causal_parts(causal_model)


def _read(uri: str, refs: str | None, name: str, fmt: str = "auto", options: FormatOptions | None = None) -> pa.Table:
    table = read_nbest(uri, refs, fmt, options)
    require_references(table, name)
    return table


def _refuse_empty(lists: dict[str, tuple[str, pa.Table]]) -> None:
    """Refuse, before any scoring, an N-best list with no hypothesis: the weights cannot be tuned on an
    empty dev set nor applied to an empty test set (it used to score the other list, then fail)."""
    empty = [f"{flag} {uri}" for flag, (uri, table) in lists.items() if table.num_rows == 0]
    if empty:
        raise UserError(
            f"{' and '.join(empty)} {'holds' if len(empty) == 1 else 'hold'} no hypotheses; rescoring tunes the "
            "weights on the dev list and applies them to the test list, so each needs at least one utterance: "
            "check the file (or pass the same list as both to rescore one set)"
        )


def _scores(output: str, texts: list[str], scored: list[str], column: str, name: str) -> dict[str, TextScore]:
    """The LM's scores keyed by the original hypothesis texts, joined by key: a row's id is the position
    of its text in `texts`, and the text it holds must be the one scored for it (`scored`, the text with
    --append), or the folder holds another run's rows and nothing is assigned."""
    rows = OutputDir(output).read_rows([S.ID, S.TEXT, column, S.N_TOKENS, S.STATUS, S.ERROR])
    ids, held = rows[S.ID].to_pylist(), rows[S.TEXT].to_pylist()
    keys = [int(i) if isinstance(i, str) and i.isdigit() and int(i) < len(texts) else None for i in ids]
    wrong = [
        (i, h, None if k is None else scored[k]) for i, k, h in zip(ids, keys, held) if k is None or scored[k] != h
    ]
    if wrong:
        row_id, text, want = wrong[0]
        raise MixedRowsError(
            f"{output} holds {len(wrong)} row(s) of the {name} that are not this run's (e.g. id {row_id!r} scored "
            f"{text!r}, "
            + (f"its hypothesis is {want!r}" if want is not None else "no hypothesis has that id")
            + "): another run wrote into the folder; pass --overwrite to score the hypotheses afresh"
        )
    original = pa.array([texts[k] for k in keys], pa.string())
    return text_scores(rows.set_column(rows.schema.get_field_index(S.TEXT), S.TEXT, original), column, name)
