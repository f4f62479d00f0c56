"""N-best lists as toolkits write them (`nbest_formats`): a sample of each, written as its toolkit's
source writes it, read into the table; the same lists as JSONL and in every format read alike; malformed
lines named by file and line; `--format auto` refusing what it cannot tell in one line."""

from __future__ import annotations

import json
import math

import pytest

from distributed_scoring.io import nbest
from distributed_scoring.io.nbest import NBestError, read_nbest
from distributed_scoring.io.nbest_formats import FormatOptions, detect

LN2 = math.log(2)

# The lists every format must read alike: utterance -> (reference, [(text, natural-log score), ...]).
LISTS = {
    "0": ("the cat sat on the mat", [("the cat sat on the mat", -1.25), ("the cat sat on a mat", -2.5)]),
    "1": ("a dog barked", [("a dog parked", -0.75), ("a dog barked", -1.0), ("a dock barked", -3.0)]),
    "2": ("hello world", [("hello word", -0.5), ("hello world", -0.625)]),
}


def jsonl_records(ids: dict[str, str] | None = None) -> list[dict]:
    """LISTS as JSONL records, utterance ids renamed by `ids`."""
    ids = ids or {u: u for u in LISTS}
    return [
        {"utt_id": ids[u], "hyp_id": rank, "text": text, "score": score, "ref": ref}
        for u, (ref, hyps) in LISTS.items()
        for rank, (text, score) in enumerate(hyps, start=1)
    ]


def rows(table) -> list[tuple]:
    return [
        (r["utt_id"], r["hyp_id"], r["text"], pytest.approx(r["score"], rel=1e-12), r["ref"]) for r in table.to_pylist()
    ]


def same_as_jsonl(tmp_path, table, ids: dict[str, str] | None = None) -> None:
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in jsonl_records(ids)))
    expected = read_nbest(str(path))
    assert [(r[0], r[1], r[2], r[4]) for r in rows(table)] == [(r[0], r[1], r[2], r[4]) for r in rows(expected)]
    assert [r["score"] for r in table.to_pylist()] == pytest.approx([r["score"] for r in expected.to_pylist()])


def write_lines(path, lines: list[str]) -> str:
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def plain_refs(tmp_path) -> str:
    """One reference per line, in utterance order (what --dev-refs/--test-refs may be)."""
    return write_lines(tmp_path / "refs.txt", [ref for ref, _ in LISTS.values()])


# ---- fairseq -----------------------------------------------------------------------------------------


def fairseq_lines() -> list[str]:
    """fairseq_cli/generate.py (facebookresearch/fairseq): per sample `S-id<TAB>src`, `T-id<TAB>ref`, then per
    hypothesis `H-id<TAB>score<TAB>text`, `D-id<TAB>score<TAB>detok`, `P-id<TAB>positional scores`, the
    scores in base 2 (`hypo['score'] / math.log(2)`); samples in batch order, not by id; log lines between."""
    lines = ["2026-11-29 02:00:00 | INFO | fairseq_cli.generate | loading model(s) from checkpoint_best.pt"]
    for u in ("2", "0", "1"):  # batched: ids out of order
        ref, hyps = LISTS[u]
        lines += [f"S-{u}\tsource sentence {u}", f"T-{u}\t{ref}"]
        for text, score in hyps:
            base2 = score / LN2
            lines += [
                f"H-{u}\t{base2}\t{text.replace('the', 'the@@')}",  # tokenised (BPE) hypothesis
                f"D-{u}\t{base2}\t{text}",
                f"P-{u}\t{' '.join('-0.1000' for _ in text.split())}",
            ]
    lines.append("Generate test with beam=3: BLEU4 = 41.23, 70.1/48.9/35.5/26.2 (BP=1.000, ratio=1.002)")
    return lines


def test_fairseq_generate_output(tmp_path):
    path = write_lines(tmp_path / "generate-test.txt", fairseq_lines())
    assert detect(path) == "fairseq"
    table = read_nbest(path, fmt="fairseq")
    same_as_jsonl(tmp_path, table)  # ids by number, D- text, scores * ln 2, T- references
    assert read_nbest(path).equals(table)


def test_fairseq_without_d_lines_reads_h_lines(tmp_path):
    lines = [line for line in fairseq_lines() if not line.startswith("D-")]
    table = read_nbest(write_lines(tmp_path / "g.txt", lines))
    assert table.column("text").to_pylist()[0] == "the@@ cat sat on the@@ mat"


# ---- Moses / Marian ----------------------------------------------------------------------------------


def moses_lines(features: str = "F0= {s}") -> list[str]:
    """moses/src/Manager.cpp OutputNBest (and marian src/translator/output_printer.h, which writes the same
    shape): `id ||| text ||| features ||| total`, the id the 0-based source line."""
    return [
        f"{u} ||| {text} ||| {features.format(s=score)} ||| {score}"
        for u, (_, hyps) in LISTS.items()
        for text, score in hyps
    ]


@pytest.mark.parametrize(
    "fmt, features",
    [
        ("marian", "F0= {s} F1= -0.5"),  # Marian: one F<i>= per scorer
        ("moses", "Distortion0= 0 LM0= -12.4 WordPenalty0= -6 TranslationModel0= -3.1 -2.2 {s}"),
    ],
)
def test_marian_and_moses_nbest(tmp_path, fmt, features):
    path = write_lines(tmp_path / "test.nbest", moses_lines(features))
    assert detect(path) == "moses"  # the shape is Moses's own; Marian writes it too
    table = read_nbest(path, references=plain_refs(tmp_path), fmt=fmt)
    same_as_jsonl(tmp_path, table)
    assert table.column(nbest.FEATURES).to_pylist()[0] == features.format(s=-1.25)


# ---- ESPnet ------------------------------------------------------------------------------------------

ESPNET_IDS = {"0": "1272-128104-0000", "1": "1272-128104-0001", "2": "1272-128104-0002"}


def espnet2_folder(tmp_path):
    """espnet2/bin/asr_inference.py (espnet/espnet): DatadirWriter `{n}best_recog/text` (`key text`) and
    `{n}best_recog/score` (`key str(hyp.score)`, a tensor's repr), one folder per rank."""
    folder = tmp_path / "decode_asr" / "logdir" / "output.1"
    for u, (_, hyps) in LISTS.items():
        for rank, (text, score) in enumerate(hyps, start=1):
            recog = folder / f"{rank}best_recog"
            recog.mkdir(parents=True, exist_ok=True)
            with open(recog / "text", "a") as f:
                f.write(f"{ESPNET_IDS[u]} {text.upper().lower()}\n")
            with open(recog / "score", "a") as f:
                f.write(f"{ESPNET_IDS[u]} tensor({score:.4f}" + (", device='cuda:0')\n" if rank == 2 else ")\n"))
            with open(recog / "token", "a") as f:
                f.write(f"{ESPNET_IDS[u]} {' '.join(text.replace(' ', '_'))}\n")
    return folder


def test_espnet2_nbest_recog_folder(tmp_path):
    folder = espnet2_folder(tmp_path)
    refs = write_lines(tmp_path / "text", [f"{ESPNET_IDS[u]} {ref}" for u, (ref, _) in LISTS.items()])  # data/test/text
    assert detect(str(folder)) == "espnet"
    table = read_nbest(str(folder), references=refs)
    same_as_jsonl(tmp_path, table, ESPNET_IDS)


def test_espnet1_recognition_json(tmp_path):
    """espnet/asr/asr_utils.py add_results_to_json: `output` holds one entry per hypothesis, the input's
    output entry (`text` = reference, `token`, `shape`, ...) plus `rec_text` (tokens joined, `<eos>` kept),
    `rec_token`, `rec_tokenid` and `score`; `name` gets `[n]`."""
    utts = {}
    for u, (ref, hyps) in LISTS.items():
        outputs = []
        for rank, (text, score) in enumerate(hyps, start=1):
            pieces = "\u2581" + text.replace(" ", "\u2581")  # sentencepiece tokens joined
            outputs.append(
                {
                    "name": f"target1[{rank}]",
                    "shape": [len(ref.split()), 5000],
                    "text": ref,
                    "token": ref,
                    "tokenid": "1 2 3",
                    "rec_text": pieces + "<eos>",
                    "rec_token": " ".join(pieces) + " <eos>",
                    "rec_tokenid": "4 5 6 2",
                    "score": score,
                }
            )
        utts[ESPNET_IDS[u]] = {"output": outputs, "utt2spk": "1272-128104"}
    path = tmp_path / "data.1.json"
    path.write_text(json.dumps({"utts": utts}, indent=4))
    assert detect(str(path)) == "espnet"
    same_as_jsonl(tmp_path, read_nbest(str(path)), ESPNET_IDS)


def test_mlm_scoring_json_is_still_the_json_default(tmp_path):
    """mlm-scoring's ESPnet-style JSON (Shin et al. 2019): `{utt: {"ref", "hyp_1": {"score", "text"}}}`."""
    document = {
        ESPNET_IDS[u]: {"ref": ref, **{f"hyp_{k}": {"score": s, "text": f" {t}"} for k, (t, s) in enumerate(hyps, 1)}}
        for u, (ref, hyps) in LISTS.items()
    }
    path = tmp_path / "dev.am.json"
    path.write_text(json.dumps(document))
    assert detect(str(path)) == "mlm-scoring"
    same_as_jsonl(tmp_path, read_nbest(str(path)), ESPNET_IDS)
    assert read_nbest(str(path), fmt="mlm-scoring").equals(read_nbest(str(path)))


# ---- NeMo --------------------------------------------------------------------------------------------


def nemo_lines() -> list[str]:
    """NeMo scripts/asr_language_modeling/ngram_lm/eval_beamsearch_ngram.py beam_search_eval:
    `out_file.write('{}\\t{}\\n'.format(pred_text, score))` for every candidate of every beam, in turn."""
    width = max(len(hyps) for _, hyps in LISTS.values())
    lines = []
    for _, hyps in LISTS.values():
        padded = hyps + [(f"filler {i}", -50.0 - i) for i in range(width - len(hyps))]
        lines += [f"{text}\t{score}" for text, score in padded]
    return lines


def test_nemo_beam_tsv(tmp_path):
    path = write_lines(tmp_path / "preds_out_width3_alpha0.5_beta1.0.tsv", nemo_lines())
    assert detect(path) == "nemo"
    table = read_nbest(path, fmt="nemo", options=FormatOptions(beam_size=3), references=plain_refs(tmp_path))
    assert table.num_rows == 9 and table.column("text").to_pylist()[2] == "filler 0"
    by_refs = read_nbest(path, references=plain_refs(tmp_path))  # 9 candidates / 3 references: beams of 3
    assert by_refs.equals(table)
    kept = table.filter([not t.startswith("filler") for t in table.column("text").to_pylist()])
    same_as_jsonl(tmp_path, kept)


def test_nemo_beams_that_do_not_split_are_refused(tmp_path):
    path = write_lines(tmp_path / "preds.tsv", nemo_lines()[:-1])
    with pytest.raises(NBestError, match=r"8 candidates do not split into beams of 3.*--beam-size") as info:
        read_nbest(path, fmt="nemo", options=FormatOptions(beam_size=3))
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(NBestError, match=r"no utterance ids.*--beam-size N"):
        read_nbest(path, fmt="nemo")


# ---- Kaldi -------------------------------------------------------------------------------------------


def kaldi_folder(tmp_path, acwt: float):
    """Kaldi nbest-to-linear's archives in text form (as egs/*/steps/rnnlmrescore.sh and local n-best
    scripts write them, words through utils/int2sym.pl): `utt-N words`, `utt-N lm_cost`, `utt-N ac_cost`;
    Kaldi's total cost is acwt * ac_cost + lm_cost."""
    folder = tmp_path / "nbest"
    folder.mkdir()
    text, lm, ac = [], [], []
    for u, (_, hyps) in LISTS.items():
        for rank, (words, score) in enumerate(hyps, start=1):
            key = f"{ESPNET_IDS[u]}-{rank}"
            lm_cost = 2.0 + rank
            text.append(f"{key} {words}")
            lm.append(f"{key} {lm_cost}")
            ac.append(f"{key} {(-score - lm_cost) / acwt}")
    return write_lines(folder / "text", text), write_lines(folder / "lm_cost", lm), write_lines(folder / "ac_cost", ac)


def test_kaldi_nbest_with_its_costs(tmp_path):
    text, _, _ = kaldi_folder(tmp_path, acwt=0.1)
    assert detect(text) == "kaldi" and detect(str(tmp_path / "nbest")) == "kaldi"
    refs = write_lines(tmp_path / "text", [f"{ESPNET_IDS[u]} {ref}" for u, (ref, _) in LISTS.items()])
    table = read_nbest(text, references=refs, options=FormatOptions(kaldi_acwt=0.1))
    same_as_jsonl(tmp_path, table, ESPNET_IDS)
    assert read_nbest(str(tmp_path / "nbest"), references=refs, options=FormatOptions(kaldi_acwt=0.1)).equals(table)


# ---- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, lines, bad_line, message",
    [
        ("fairseq", ["S-0\tsrc", "H-0\tnot-a-score\tthe cat"], 2, "the score 'not-a-score' is not a number"),
        ("fairseq", ["S-0\tsrc", "H-0 -1.5 the cat"], 2, "a fairseq line must read"),
        ("fairseq", ["H-0\t-1.5\tthe cat", "0 ||| the cat ||| F0= -1 ||| -1"], 2, "moses line in a fairseq list"),
        ("moses", ["0 ||| the cat ||| F0= -1 ||| -1", "0 ||| the cat ||| -1"], 2, r"expected `id \|\|\| text"),
        ("marian", ["zero ||| the cat ||| F0= -1 ||| -1"], 1, r"expected `id \|\|\| text"),
        ("nemo", ["the cat\t-1.0", "the cat -1.0"], 2, "expected `text<TAB>score`"),
        ("nemo", ["the cat\t-1.0", "the hat\tnan"], 2, "not a finite log-score"),
    ],
)
def test_a_malformed_line_names_its_file_and_line(tmp_path, fmt, lines, bad_line, message):
    path = write_lines(tmp_path / "list.txt", lines)
    with pytest.raises(NBestError, match=message) as info:
        read_nbest(path, fmt=fmt, options=FormatOptions(beam_size=1))
    assert f"{path} line {bad_line}" in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_malformed_kaldi_cost_or_espnet_score_names_its_file_and_line(tmp_path):
    text, lm, _ = kaldi_folder(tmp_path, acwt=1.0)
    lines = open(lm).read().splitlines()
    lines[3] = lines[3].split()[0] + " oops"
    write_lines(tmp_path / "nbest" / "lm_cost", lines)
    with pytest.raises(NBestError, match=rf"{tmp_path}/nbest/lm_cost line 4: the score 'oops'"):
        read_nbest(text, fmt="kaldi")
    folder = espnet2_folder(tmp_path)
    (folder / "2best_recog" / "score").write_text("1272-128104-0000 tensor(-2.5)\n1272-128104-0001 tensor(x)\n")
    with pytest.raises(NBestError, match=r"2best_recog/score line 2: the score 'x'"):
        read_nbest(str(folder), fmt="espnet")


def test_auto_refuses_in_one_line_what_it_cannot_tell(tmp_path):
    # `utt-1<TAB>-2.5` reads as NeMo's `text<TAB>score` and, with lm_cost and ac_cost beside it, as Kaldi's.
    (tmp_path / "lm_cost").write_text("a-1 1.0\n")
    (tmp_path / "ac_cost").write_text("a-1 1.0\n")
    ambiguous = write_lines(tmp_path / "nbest.txt", ["a-1\t-2.5"])
    unknown = write_lines(tmp_path / "words.txt", ["nothing here says what this is"])
    mixed = write_lines(tmp_path / "mixed.txt", ["H-0\t-1.5\tthe cat", "0 ||| the cat ||| F0= -1 ||| -1"])
    for path, message in (
        (ambiguous, r"reads as more than one N-best format \(nemo, kaldi\); name the right one with --format"),
        (unknown, r"cannot tell the format of .*words.txt.*--format"),
        (mixed, r"mixes N-best formats \(line 1 is fairseq, line 2 is moses\)"),
    ):
        with pytest.raises(NBestError, match=message) as info:
            read_nbest(path)
        assert len(str(info.value).splitlines()) == 1


def test_format_names_are_checked(tmp_path):
    path = write_lines(tmp_path / "n.jsonl", [json.dumps(jsonl_records()[0])])
    with pytest.raises(NBestError, match=r"'espnet1' is not one of auto, jsonl, parquet, fairseq, marian, moses"):
        read_nbest(path, fmt="espnet1")
    with pytest.raises(NBestError, match="--kaldi-acwt must be a positive number"):
        FormatOptions(kaldi_acwt=0.0)
