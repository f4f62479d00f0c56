"""Bulk N-best rescoring end to end (`dscore rescore`): each unique hypothesis text is scored once, through
the same sharded pipeline as `dscore score` (in this process or on Ray), then combined and tuned.

Layout of the output folder DIR:
    DIR/texts/texts.parquet      the unique hypothesis texts to score (sorted; id = their position)
    DIR/mlm/                     the masked LM's scoring run over them (rows/, summary.json, resumable)
    DIR/maskless/                instead, with method `maskless`: a maskless student's predicted PLLs
    DIR/unmasked/                instead, with method `unmasked`: the masked LM's one-pass scores
    DIR/causal/                  the causal LM's run, when one is given
    DIR/hypotheses.parquet, DIR/best.parquet, DIR/{dev,test}.best.txt, DIR/report.json, DIR/report.md
Rerunning the same command after a crash resumes the LM runs and redoes the cheap combination.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ...io import schema as S
from ...config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from ...io.nbest import read_nbest, require_references, unique_texts
from ...io.output import OutputDir
from .rescoring import RescoreOptions, Rescored, TextScore, rescore, text_scores, write_outputs
from ...io.output import ROWS_DIR
from ...pipeline.runner import run
from ..maskless import score_maskless, score_unmasked
from ..score import score
from ...io.storage import join
from ...workloads.causal import causal_workload

logger = logging.getLogger(__name__)

TEXTS = "texts/texts.parquet"
# How the masked-LM score of a hypothesis is had, and the subfolder its scoring run writes.
SCORERS = {"pll": ("mlm", score), "maskless": ("maskless", score_maskless), "unmasked": ("unmasked", score_unmasked)}


@dataclass(frozen=True)
class RescoreInputs:
    """The N-best lists (JSONL, Parquet or ESPnet JSON), optional separate references, the output folder.

    `append` is added to every hypothesis before the LMs score it (the paper appends "." to ASR
    hypotheses, appendix A.2); scores stay keyed by the original text.
    """

    dev: str
    test: str
    output: str
    dev_refs: str | None = None
    test_refs: str | None = None
    append: str = ""
    shard_rows: int = 1000


def rescore_nbest(inputs: RescoreInputs, model: ModelSpec | None, causal_model: ModelSpec | None,
                  scoring: ScoringOptions, options: RescoreOptions, ray: RayOptions | None = None,
                  overwrite: bool = False, method: str = "pll") -> Rescored:
    """Check every model loads, read, score the unique texts with each LM, tune on dev, apply to test,
    write the outputs. `method` says what stands for the masked LM's score: its PLL, a maskless student's
    predicted PLL (`maskless`: `model` is the student folder from `dscore train maskless`), or its
    one-pass score of the unmasked text (`unmasked`)."""
    check_models(model, causal_model, method)
    dev = _read(inputs.dev, inputs.dev_refs, "dev")
    test = _read(inputs.test, inputs.test_refs, "test")
    texts = unique_texts(dev, test)
    logger.info("%d + %d hypotheses, %d unique texts", dev.num_rows, test.num_rows, len(texts))
    started = time.monotonic()
    texts_file = _write_texts(inputs.output, [t + inputs.append for t in texts])
    corpus = InputSpec((texts_file,), id_column=S.ID, shard_rows=inputs.shard_rows)
    mlm = causal = None
    if model is not None:
        folder, scorer = SCORERS[method]
        config = RunConfig(corpus, model, scoring, join(inputs.output, folder))
        scorer(config, ray, overwrite)
        mlm = _scores(config.output, texts, S.PLL, "masked LM")
    if causal_model is not None:
        config = RunConfig(corpus, causal_model, scoring, join(inputs.output, "causal"))
        run(config, causal_workload(causal_model, scoring.batch_tokens), ray, overwrite)
        causal = _scores(config.output, texts, S.LOGP, "causal LM")
    seconds = time.monotonic() - started
    result = rescore(dev, test, mlm, causal, options)
    result.report["scoring"] = {
        "hypotheses": dev.num_rows + test.num_rows,
        "unique_texts": len(texts),
        "seconds": round(seconds, 3),
        "hypotheses_per_s": round((dev.num_rows + test.num_rows) / max(seconds, 1e-9), 2),
        "unique_texts_per_s": round(len(texts) / max(seconds, 1e-9), 2),
        "note": "each distinct hypothesis text is scored once per LM; a resumed run counts only what it scored",
    }
    write_outputs(result, inputs.output)
    return result


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


def _read(uri: str, refs: str | None, name: str) -> pa.Table:
    table = read_nbest(uri, references=refs)
    require_references(table, name)
    return table


def _write_texts(output: str, texts: list[str]) -> str:
    """The texts as a Parquet corpus with ids; the same texts give the same file (and shard plan)."""
    ids = [f"{i:09d}" for i in range(len(texts))]
    return OutputDir(output).write_table(TEXTS, pa.table({S.ID: ids, S.TEXT: texts}))


def _scores(output: str, texts: list[str], column: str, name: str) -> dict[str, TextScore]:
    """The LM's scores keyed by the original hypothesis texts (ids are positions in `texts`)."""
    rows = pq.read_table(join(output, ROWS_DIR), columns=[S.ID, S.TEXT, column, S.N_TOKENS, S.STATUS, S.ERROR])
    original = pa.array([texts[int(i)] for i in rows[S.ID].to_pylist()], pa.string())
    return text_scores(rows.set_column(rows.schema.get_field_index(S.TEXT), S.TEXT, original), column, name)
