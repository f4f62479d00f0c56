"""N-best lists written as each toolkit writes them, from JSONL-style records (`utt_id`, `hyp_id`, `text`,
`score` (natural log), `ref`), for the reader's tests and the end-to-end equivalence of `dscore rescore`.
Each writer cites the toolkit source whose output it imitates. fairseq, Moses/Marian and NeMo number
utterances by position, so records for them have ids "0", "1", ... in order."""

from __future__ import annotations

import json
import math
from pathlib import Path

LN2 = math.log(2)


def by_utt(records: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for r in records:
        grouped.setdefault(r["utt_id"], []).append(r)
    return {u: sorted(hyps, key=lambda r: r["hyp_id"]) for u, hyps in grouped.items()}


def write_lines(path: Path, lines: list[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def write_jsonl(path: Path, records: list[dict]) -> str:
    return write_lines(path, [json.dumps(r) for r in records])


def write_fairseq(path: Path, records: list[dict], order: list[str] | None = None) -> str:
    """fairseq_cli/generate.py (facebookresearch/fairseq): per sample `S-id<TAB>src` and `T-id<TAB>ref`, then
    per hypothesis `H-id<TAB>score<TAB>tokens`, `D-id<TAB>score<TAB>detokenised`, `P-id<TAB>positional
    scores`, every score in base 2 (`hypo['score'] / math.log(2)`); samples in batch order (`order`), with
    log lines before and `Generate test with beam=...` after."""
    groups = by_utt(records)
    lines = ["2026-11-29 02:00:00 | INFO | fairseq_cli.generate | loading model(s) from checkpoint_best.pt"]
    for u in order or list(groups):
        lines += [f"S-{u}\tsource sentence {u}", f"T-{u}\t{groups[u][0]['ref']}"]
        for r in groups[u]:
            base2 = r["score"] / LN2
            lines += [
                f"H-{u}\t{base2}\t{r['text'].replace('the', 'the@@')}",  # before detokenisation (BPE)
                f"D-{u}\t{base2}\t{r['text']}",
                f"P-{u}\t{' '.join('-0.1000' for _ in r['text'].split())}",
            ]
    lines.append("Generate test with beam=3: BLEU4 = 41.23, 70.1/48.9/35.5/26.2 (BP=1.000, ratio=1.002)")
    return write_lines(path, lines)


def write_moses(path: Path, records: list[dict], features: str = "F0= {s}") -> str:
    """moses-smt/mosesdecoder moses/Manager.cpp OutputNBest (Marian's src/translator/output_printer.h
    writes the same shape): `id ||| text ||| features ||| total`, the id the 0-based source line."""
    return write_lines(
        path, [f"{r['utt_id']} ||| {r['text']} ||| {features.format(s=r['score'])} ||| {r['score']}" for r in records]
    )


def write_nemo(path: Path, records: list[dict], beam: int) -> str:
    """NVIDIA/NeMo scripts/asr_language_modeling/ngram_lm/eval_beamsearch_ngram.py beam_search_eval:
    `out_file.write('{}\\t{}\\n'.format(pred_text, score))` for every candidate of every beam in turn; a
    beam shorter than `beam` is padded with unlikely candidates (NeMo's beams are all full)."""
    lines = []
    for hyps in by_utt(records).values():
        lines += [f"{r['text']}\t{r['score']}" for r in hyps]
        lines += [f"filler {i}\t{-100.0 - i}" for i in range(beam - len(hyps))]
    return write_lines(path, lines)


def write_kaldi(folder: Path, records: list[dict], acwt: float) -> str:
    """Kaldi nbest-to-linear's text archives, words through utils/int2sym.pl (as egs/wsj/s5/steps/
    rnnlmrescore.sh and local n-best scripts leave them): `utt-N words`, `utt-N lm_cost`, `utt-N ac_cost`;
    Kaldi's total cost is acwt * ac_cost + lm_cost = -score."""
    text, lm, ac = [], [], []
    for r in records:
        key, lm_cost = f"{r['utt_id']}-{r['hyp_id']}", 2.0 + r["hyp_id"]
        text.append(f"{key} {r['text']}")
        lm.append(f"{key} {lm_cost}")
        ac.append(f"{key} {(-r['score'] - lm_cost) / acwt}")
    write_lines(folder / "lm_cost", lm)
    write_lines(folder / "ac_cost", ac)
    return write_lines(folder / "text", text)


def write_espnet2(folder: Path, records: list[dict]) -> str:
    """espnet/espnet espnet2/bin/asr_inference.py: DatadirWriter `{n}best_recog/text` (`key text`),
    `{n}best_recog/token`, `{n}best_recog/score` (`key str(hyp.score)`, a tensor's repr, with its device
    off the CPU), one folder per rank."""
    for u, hyps in by_utt(records).items():
        for r in hyps:
            recog = folder / f"{r['hyp_id']}best_recog"
            recog.mkdir(parents=True, exist_ok=True)
            device = ", device='cuda:0'" if r["hyp_id"] % 2 == 0 else ""
            with open(recog / "text", "a") as f:
                f.write(f"{u} {r['text']}\n")
            with open(recog / "score", "a") as f:
                f.write(f"{u} tensor({r['score']!r}{device})\n")
            with open(recog / "token", "a") as f:
                f.write(f"{u} {' '.join(r['text'].replace(' ', '_'))}\n")
    return str(folder)


def write_espnet1(path: Path, records: list[dict]) -> str:
    """espnet/espnet espnet/asr/asr_utils.py add_results_to_json: per utterance `output`, one entry per
    hypothesis: the input's output entry (`text` = reference, `token`, `shape`, ...) with `name` + `[n]`,
    `rec_text` (tokens joined, `<space>` as a space, `<eos>` kept), `rec_token`, `rec_tokenid`, `score`."""
    utts = {}
    for u, hyps in by_utt(records).items():
        outputs = []
        for r in hyps:
            pieces = "\u2581" + r["text"].replace(" ", "\u2581")  # sentencepiece tokens joined
            entry = {"name": f"target1[{r['hyp_id']}]", "shape": [3, 5000], "text": r["ref"], "token": r["ref"]}
            entry.update(rec_text=pieces + "<eos>", rec_token=" ".join(pieces) + " <eos>", rec_tokenid="4 5 2")
            outputs.append({**entry, "tokenid": "1 2 3", "score": r["score"]})
        utts[u] = {"output": outputs, "utt2spk": "spk1"}
    path.write_text(json.dumps({"utts": utts}, indent=4, sort_keys=True))
    return str(path)


def write_mlm_scoring(path: Path, records: list[dict]) -> str:
    """mlm-scoring's ESPnet-style JSON (Shin et al. 2019 lists): `{utt: {"ref", "hyp_<n>": {"score", "text"}}}`,
    texts with a leading space."""
    document = {
        u: {
            "ref": hyps[0]["ref"],
            **{f"hyp_{r['hyp_id']}": {"score": r["score"], "text": f" {r['text']}"} for r in hyps},
        }
        for u, hyps in by_utt(records).items()
    }
    path.write_text(json.dumps(document))
    return str(path)


def write_refs(path: Path, records: list[dict], kaldi_style: bool = False) -> str:
    """References apart: one line per utterance in id order, or Kaldi's data/<set>/text (`utt_id text`)."""
    refs = {u: hyps[0]["ref"] for u, hyps in by_utt(records).items()}
    return write_lines(path, [f"{u} {ref}" if kaldi_style else ref for u, ref in refs.items()])
