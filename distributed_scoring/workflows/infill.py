"""`dscore infill`: fill the masked spans of every input row, then summarise how well the fills match.

The rows go through the shared shard pipeline (resumable, in this process or on Ray). The summary, written
to `summary.json` and `report.md`, counts the rows that carried an answer: exact-match accuracy of the
whole span at ranks 1 .. `--top` (a fill is right when every token equals the answer's token as the
tokenizer writes it or as it reads in text), per-token accuracy of the best fill, and corpus BLEU of the
best fills against the answers (sacrebleu on the fill tokens as they read, no further tokenisation;
BLEU-n with n = the shortest span when a span has fewer than 4 tokens). For `exact`, the same accuracies
under the HCB joint (and the PLL with --rescore-pll) show each ranking's ground truth.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pyarrow.compute as pc

from ..config import RayOptions, RunConfig
from ..errors import UserError
from ..io import schema as S
from ..io.output import REPORT_MD, OutputDir
from ..pipeline.memory import check_memory, text_tokens
from ..pipeline.runner import Finished, run
from ..workloads.infill import (  # InfillOptions: what the CLI builds a run from
    BEAMS,
    CORRECT_TOKENS,
    N_MASKS,
    RANK,
    RANK_HCB,
    RANK_PLL,
    InfillOptions,
    allowed_tokens,
    infill_workload,
    memory_estimate,
    pivot_id,
    surface,
)

__all__ = ["InfillOptions", "infill", "summarize"]

logger = logging.getLogger(__name__)


def infill(config: RunConfig, options: InfillOptions, ray: RayOptions | None = None, overwrite: bool = False) -> dict:
    """Fill every input row; returns the summary (also written to summary.json).

    The tokenizer is loaded here first, so a model, a --vocab-restrict token or a pivot that cannot be
    used stops the run before any file is written.
    """
    from ..engine.model_files import load_tokenizer

    tokenizer, max_length = load_tokenizer(config.model)
    if tokenizer.mask_token is None:
        raise UserError(f"{config.model.name!r} has no mask token, so it cannot fill masked spans")
    allowed = allowed_tokens(tokenizer, len(tokenizer), options.vocab_restrict)
    pivot_id(tokenizer, options.pivot)
    check_memory(
        "dscore infill", memory_estimate(options, config.inputs.shard_rows, text_tokens(max_length), int(allowed.sum()))
    )
    config = replace(config, inputs=replace(config.inputs, extra_columns=(options.answer_column,)))
    workload = infill_workload(config.model, options, config.scoring.batch_tokens)
    return run(
        config,
        workload,
        ray,
        overwrite,
        summarise=lambda done: summarize(done, options, tokenizer),
        report=_write_report,
        outputs=(REPORT_MD,),
    )


def summarize(done: Finished, options: InfillOptions, tokenizer) -> dict:
    """The figures of `summary.json` from the finished run's rows (see the module docstring), and its model."""
    columns = [S.STATUS, N_MASKS, RANK, CORRECT_TOKENS, BEAMS, "answer"]
    if options.decoder == "exact":
        columns += [RANK_HCB] + ([RANK_PLL] if options.rescore_pll else [])
    table = done.out.read_rows(columns)
    ok = table.filter(pc.equal(table[S.STATUS], S.STATUS_OK))
    judged = ok.filter(pc.is_valid(ok["answer"])).to_pylist()
    summary = {
        "rows": table.num_rows,
        "ok": ok.num_rows,
        "errors": table.num_rows - ok.num_rows,
        "decoder": options.decoder,
        "order": options.order,
        "beam": options.beam,
        "top": options.written,
        "with_answer": len(judged),
        "examples_per_s": done.rows_now / done.seconds if done.seconds > 0 and done.rows_now else None,
    }
    if judged:
        summary["accuracy"] = _accuracy(judged, RANK, options.written)
        summary["token_accuracy"] = sum(r[CORRECT_TOKENS] for r in judged) / sum(r[N_MASKS] for r in judged)
        summary["bleu"] = _bleu(judged, tokenizer)
        if options.decoder == "exact":
            summary["accuracy_hcb"] = _accuracy(judged, RANK_HCB, options.written)
            if options.rescore_pll:
                summary["accuracy_pll"] = _accuracy(judged, RANK_PLL, options.written)
    summary["model"] = done.config.model.name
    return summary


def _accuracy(rows: list[dict], rank: str, top: int) -> dict[str, float]:
    """Top-k exact-match accuracy of the whole span, k = 1 .. top."""
    return {
        f"top{k}": sum(1 for r in rows if r[rank] is not None and r[rank] <= k) / len(rows) for k in range(1, top + 1)
    }


def _bleu(rows: list[dict], tokenizer) -> dict:
    """Corpus BLEU of the best fills (tokens as they read) against the answers."""
    return token_bleu(
        [" ".join(surface(tokenizer, t) for t in r[BEAMS][0]["tokens"]) for r in rows], [r["answer"] for r in rows]
    )


def token_bleu(hypotheses: list[str], answers: list[str]) -> dict:
    """Corpus BLEU of space-separated tokens against the answers' (sacrebleu, no further tokenisation):
    BLEU-n with n = the shortest answer's length when that is under 4 tokens, since a 3-token span has
    no 4-grams and plain BLEU-4 would be 0 for every fill."""
    from sacrebleu.metrics import BLEU

    order = min(4, min(len(a.split()) for a in answers))
    score = BLEU(tokenize="none", max_ngram_order=order).corpus_score(
        hypotheses, [[" ".join(a.split()) for a in answers]]
    )
    return {"score": score.score, "max_ngram_order": order}


def _write_report(out: OutputDir, summary: dict) -> None:
    """report.md beside the rows."""
    out.write_text(REPORT_MD, render_infill_report(summary))


def render_infill_report(summary: dict) -> str:
    """One table of the run's figures, for people."""
    lines = [
        f"# Infilling: {summary['model']}",
        "",
        f"decoder `{summary['decoder']}`, order `{summary['order']}`, beam {summary['beam']}; "
        f"{summary['ok']} rows filled, {summary['errors']} error rows, {summary['with_answer']} with an answer.",
        "",
    ]
    if summary.get("accuracy"):
        ks = list(summary["accuracy"])
        lines += ["| ranking | " + " | ".join(ks) + " | token accuracy | BLEU |", "|---|" + "---:|" * (len(ks) + 2)]
        bleu = summary["bleu"]
        for name, key in (("decoder", "accuracy"), ("HCB (exact)", "accuracy_hcb"), ("PLL (exact)", "accuracy_pll")):
            if key in summary:
                extra = (
                    f"{summary['token_accuracy']:.3f} | {bleu['score']:.2f} (BLEU-{bleu['max_ngram_order']})"
                    if key == "accuracy"
                    else " | "
                )
                lines.append(f"| {name} | " + " | ".join(f"{summary[key][k]:.3f}" for k in ks) + f" | {extra} |")
    if summary.get("examples_per_s"):
        lines += ["", f"{summary['examples_per_s']:.2f} examples/s in this run."]
    return "\n".join(lines) + "\n"
