"""N-best lists as toolkits write them (`nbest_formats`): a sample of each, written as its toolkit's
source writes it, read into the table; the same lists as JSONL and in every format read alike; malformed
lines named by file and line; `--format auto` refusing what it cannot tell in one line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from distributed_scoring.errors import UserError
from distributed_scoring.io import nbest
from distributed_scoring.io.nbest import NBestError, read_nbest
from distributed_scoring.io.nbest_formats import FormatOptions, RescoredHypothesis, detect, rescored_files

from helpers import nbest_samples as S

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


def same_as_jsonl(tmp_path, table, records: list[dict]) -> None:
    """`table` holds what the JSONL of `records` reads to: utterances, ranks, texts, references, and the
    natural-log scores (to rounding: fairseq's pass through base 2, Kaldi's through costs)."""
    expected = read_nbest(S.write_jsonl(tmp_path / "same.jsonl", records))
    columns = ["utt_id", "hyp_id", "text", "ref"]
    assert table.select(columns).equals(expected.select(columns))
    assert table.column("score").to_pylist() == pytest.approx(expected.column("score").to_pylist(), rel=1e-12)


def test_fairseq_generate_output(tmp_path):
    records = jsonl_records()
    path = S.write_fairseq(tmp_path / "generate-test.txt", records, order=["2", "0", "1"])  # batches: ids interleaved
    assert detect(path) == "fairseq"
    table = read_nbest(path, fmt="fairseq")
    same_as_jsonl(tmp_path, table, records)  # ids by number, D- texts, base-2 scores * ln 2, T- references
    assert read_nbest(path).equals(table)


def test_fairseq_without_d_lines_reads_h_lines(tmp_path):
    path = S.write_fairseq(tmp_path / "g.txt", jsonl_records())
    lines = [line for line in open(path).read().splitlines() if not line.startswith("D-")]
    table = read_nbest(S.write_lines(tmp_path / "h.txt", lines))
    assert table.column("text").to_pylist()[0] == "the@@ cat sat on the@@ mat"


@pytest.mark.parametrize(
    "fmt, features",
    [
        ("marian", "F0= {s} F1= -0.5"),  # Marian: one F<i>= per scorer
        ("moses", "Distortion0= 0 LM0= -12.4 WordPenalty0= -6 TranslationModel0= -3.1 -2.2 {s}"),
    ],
)
def test_marian_and_moses_nbest(tmp_path, fmt, features):
    records = jsonl_records()
    path = S.write_moses(tmp_path / "test.nbest", records, features)
    assert detect(path) == "moses"  # the shape is Moses's own; Marian writes it too
    table = read_nbest(path, references=S.write_refs(tmp_path / "refs.txt", records), fmt=fmt)
    same_as_jsonl(tmp_path, table.drop_columns([nbest.FEATURES]), records)
    assert table.column(nbest.FEATURES).to_pylist()[0] == features.format(s=-1.25)


ESPNET_IDS = {"0": "1272-128104-0000", "1": "1272-128104-0001", "2": "1272-128104-0002"}


def test_espnet2_nbest_recog_folder(tmp_path):
    records = jsonl_records(ESPNET_IDS)
    folder = S.write_espnet2(tmp_path / "decode_asr" / "logdir" / "output.1", records)
    refs = S.write_refs(tmp_path / "text", records, kaldi_style=True)  # data/test/text
    assert detect(folder) == "espnet"
    same_as_jsonl(tmp_path, read_nbest(folder, references=refs), records)


def test_espnet2_score_is_a_tensor_repr(tmp_path):
    """str(hyp.score) of a torch scalar: 4 decimals, `device=` off the CPU."""
    folder = tmp_path / "out"
    S.write_lines(folder / "1best_recog" / "text", ["u1 hello world", "u2 good bye"])
    S.write_lines(folder / "1best_recog" / "score", ["u1 tensor(-12.3457, device='cuda:0')", "u2 tensor(-0.5000)"])
    assert read_nbest(str(folder)).column("score").to_pylist() == [-12.3457, -0.5]


def test_espnet1_recognition_json(tmp_path):
    records = jsonl_records(ESPNET_IDS)
    path = S.write_espnet1(tmp_path / "data.1.json", records)
    assert detect(path) == "espnet"
    same_as_jsonl(tmp_path, read_nbest(path), records)


def test_mlm_scoring_json_is_still_the_json_default(tmp_path):
    records = jsonl_records(ESPNET_IDS)
    path = S.write_mlm_scoring(tmp_path / "dev.am.json", records)
    assert detect(path) == "mlm-scoring"
    same_as_jsonl(tmp_path, read_nbest(path), records)
    assert read_nbest(path, fmt="mlm-scoring").equals(read_nbest(path))


def test_nemo_beam_tsv(tmp_path):
    records = jsonl_records()
    path = S.write_nemo(tmp_path / "preds_out_width3_alpha0.5_beta1.0.tsv", records, beam=3)
    refs = S.write_refs(tmp_path / "refs.txt", records)
    assert detect(path) == "nemo"
    table = read_nbest(path, fmt="nemo", options=FormatOptions(beam_size=3), references=refs)
    assert table.num_rows == 9 and table.column("text").to_pylist()[2] == "filler 0"
    assert read_nbest(path, references=refs).equals(table)  # 9 candidates, 3 references: beams of 3
    same_as_jsonl(
        tmp_path, table.filter([not t.startswith("filler") for t in table.column("text").to_pylist()]), records
    )


def test_nemo_beams_that_do_not_split_are_refused(tmp_path):
    path = S.write_nemo(tmp_path / "preds.tsv", jsonl_records(), beam=3)
    S.write_lines(tmp_path / "preds.tsv", open(path).read().splitlines()[:-1])
    with pytest.raises(NBestError, match=r"8 candidates do not split into beams of 3.*--beam-size") as info:
        read_nbest(path, fmt="nemo", options=FormatOptions(beam_size=3))
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(NBestError, match=r"no utterance ids.*--beam-size N"):
        read_nbest(path, fmt="nemo")


def test_kaldi_nbest_with_its_costs(tmp_path):
    records = jsonl_records(ESPNET_IDS)
    text = S.write_kaldi(tmp_path / "nbest", records, acwt=0.1)
    assert detect(text) == "kaldi" and detect(str(tmp_path / "nbest")) == "kaldi"
    refs = S.write_refs(tmp_path / "text", records, kaldi_style=True)
    table = read_nbest(text, references=refs, options=FormatOptions(kaldi_acwt=0.1))
    same_as_jsonl(tmp_path, table, records)
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
    path = S.write_lines(tmp_path / "list.txt", lines)
    with pytest.raises(NBestError, match=message) as info:
        read_nbest(path, fmt=fmt, options=FormatOptions(beam_size=1))
    assert f"{path} line {bad_line}" in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_malformed_kaldi_cost_or_espnet_score_names_its_file_and_line(tmp_path):
    text = S.write_kaldi(tmp_path / "nbest", jsonl_records(ESPNET_IDS), acwt=1.0)
    lines = open(tmp_path / "nbest" / "lm_cost").read().splitlines()
    lines[3] = lines[3].split()[0] + " oops"
    S.write_lines(tmp_path / "nbest" / "lm_cost", lines)
    with pytest.raises(NBestError, match=rf"{tmp_path}/nbest/lm_cost line 4: the score 'oops'"):
        read_nbest(text, fmt="kaldi")
    folder = Path(S.write_espnet2(tmp_path / "out", jsonl_records(ESPNET_IDS)))
    (folder / "2best_recog" / "score").write_text("1272-128104-0000 tensor(-2.5)\n1272-128104-0001 tensor(x)\n")
    with pytest.raises(NBestError, match=r"2best_recog/score line 2: the score 'x'"):
        read_nbest(str(folder), fmt="espnet")


def test_auto_refuses_in_one_line_what_it_cannot_tell(tmp_path):
    # `utt-1<TAB>-2.5` reads as NeMo's `text<TAB>score` and, with lm_cost and ac_cost beside it, as Kaldi's.
    (tmp_path / "lm_cost").write_text("a-1 1.0\n")
    (tmp_path / "ac_cost").write_text("a-1 1.0\n")
    ambiguous = S.write_lines(tmp_path / "nbest.txt", ["a-1\t-2.5"])
    unknown = S.write_lines(tmp_path / "words.txt", ["nothing here says what this is"])
    mixed = S.write_lines(tmp_path / "mixed.txt", ["H-0\t-1.5\tthe cat", "0 ||| the cat ||| F0= -1 ||| -1"])
    for path, message in (
        (ambiguous, r"reads as more than one N-best format \(nemo, kaldi\); name the right one with --format"),
        (unknown, r"cannot tell the format of .*words.txt.*--format"),
        (mixed, r"mixes N-best formats \(line 1 is fairseq, line 2 is moses\)"),
    ):
        with pytest.raises(NBestError, match=message) as info:
            read_nbest(path)
        assert len(str(info.value).splitlines()) == 1


def test_format_names_are_checked(tmp_path):
    path = S.write_lines(tmp_path / "n.jsonl", [json.dumps(jsonl_records()[0])])
    with pytest.raises(NBestError, match=r"'espnet1' is not one of auto, jsonl, parquet, fairseq, marian, moses"):
        read_nbest(path, fmt="espnet1")
    with pytest.raises(UserError, match=r"--kaldi-acwt 0 is out of bounds: it must be in \(0, 100\]"):
        FormatOptions(kaldi_acwt=0.0)
    with pytest.raises(UserError, match=r"--beam-size 0 is out of bounds: it must be at least 1"):
        FormatOptions(beam_size=0)


# ---- written back rescored ---------------------------------------------------------------------------


def written(tmp_path, files: dict) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


@pytest.mark.parametrize("fmt", ["fairseq", "moses", "marian", "nemo", "kaldi", "espnet2", "espnet1"])
def test_the_rescored_list_reads_back_in_its_format_in_rescored_order(tmp_path, fmt):
    """Rescoring that reverses every utterance's order, written back, reads as the reversed lists with the
    rescored totals as their scores: what the toolkit's own scripts then take as the 1-best."""
    ids = ESPNET_IDS if fmt in ("kaldi", "espnet2", "espnet1") else None
    records = jsonl_records(ids)
    options = FormatOptions(kaldi_acwt=0.1, beam_size=3)
    path = {
        "fairseq": lambda: S.write_fairseq(tmp_path / "in" / "gen.txt", records, order=["1", "2", "0"]),
        "moses": lambda: S.write_moses(tmp_path / "in" / "n.nbest", records),
        "marian": lambda: S.write_moses(tmp_path / "in" / "n.nbest", records),
        "nemo": lambda: S.write_nemo(tmp_path / "in" / "beams.tsv", records, beam=3),
        "kaldi": lambda: S.write_kaldi(tmp_path / "in", records, acwt=0.1),
        "espnet2": lambda: S.write_espnet2(tmp_path / "in", records),
        "espnet1": lambda: S.write_espnet1(tmp_path / "in.json", records),
    }[fmt]()
    read_as = "espnet" if fmt.startswith("espnet") else fmt
    table = read_nbest(path, fmt=read_as, options=options)
    sizes = Counter(table.column("utt_id").to_pylist())
    rescored = {
        (r["utt_id"], r["hyp_id"]): RescoredHypothesis(
            total=-10.0 * (sizes[r["utt_id"]] - r["hyp_id"]) - 0.25,
            lm_score=-r["hyp_id"],
            rank=sizes[r["utt_id"]] + 1 - r["hyp_id"],
        )
        for r in table.to_pylist()
    }
    files = rescored_files(path, read_as, table, rescored, "test.rescored", acwt=0.1)
    written(tmp_path / "out", files)
    back = read_nbest(str(tmp_path / "out" / next(iter(files)).split("/")[0]), fmt=read_as, options=options)
    for utt_id in sizes:
        before = [r for r in table.to_pylist() if r["utt_id"] == utt_id]
        after = [r for r in back.to_pylist() if r["utt_id"] == utt_id]
        total = {r["text"]: rescored[(utt_id, r["hyp_id"])].total for r in before}
        assert {r["text"]: r["score"] for r in after} == pytest.approx(total, rel=1e-12)
        if fmt != "kaldi":  # Kaldi's keys keep their ranks; its 1-best is the lowest cost, the highest score
            assert [r["text"] for r in after] == [r["text"] for r in reversed(before)]
    if fmt in ("moses", "marian"):
        assert back.column(nbest.FEATURES).to_pylist()[0] == "F0= -2.5 MLM= -2"
    if fmt == "fairseq":  # every line kept, the hypotheses of a sample moved together
        assert sorted(open(path).read().splitlines()) != sorted(
            open(tmp_path / "out" / "test.rescored.txt").read().splitlines()
        )
        assert len(open(path).read().splitlines()) == len(
            open(tmp_path / "out" / "test.rescored.txt").read().splitlines()
        )


@pytest.mark.parametrize("fmt", ["jsonl", "mlm-scoring"])
def test_json_lists_rescored_keep_their_records_and_add_the_figures(tmp_path, fmt):
    records = jsonl_records()
    path = (
        S.write_jsonl(tmp_path / "n.jsonl", records)
        if fmt == "jsonl"
        else S.write_mlm_scoring(tmp_path / "n.json", records)
    )
    table = read_nbest(path)
    rescored = {(r["utt_id"], r["hyp_id"]): RescoredHypothesis(-float(r["hyp_id"]), -2.0, r["hyp_id"]) for r in records}
    ((name, text),) = rescored_files(path, fmt, table, rescored, "test.rescored").items()
    if fmt == "jsonl":
        assert name == "test.rescored.jsonl"
        first = json.loads(text.splitlines()[0])
        assert first == {**records[0], "mlm_score": -2.0, "total": -1.0, "rescored_rank": 1}
    else:
        assert name == "test.rescored.json"
        entry = json.loads(text)["0"]
        assert entry["ref"] == LISTS["0"][0] and entry["hyp_2"] == {
            "score": -2.5,
            "text": "the cat sat on a mat",
            "mlm_score": -2.0,
            "total": -2.0,
            "rescored_rank": 2,
        }


def test_text_references_by_line_must_cover_every_utterance(tmp_path):
    records = jsonl_records()
    path = S.write_moses(tmp_path / "test.nbest", records)
    short = S.write_lines(tmp_path / "refs.txt", ["the cat sat on the mat", "a dog barked"])
    with pytest.raises(NBestError, match=r"refs.txt: 2 reference lines for 3 utterances; give one line per utterance"):
        read_nbest(path, references=short)
    keyed = S.write_lines(tmp_path / "text", ["2 hello world", "0 the cat sat on the mat", "1 a dog barked"])
    same_as_jsonl(tmp_path, read_nbest(path, references=keyed).drop_columns([nbest.FEATURES]), records)


def test_text_references_keyed_by_ids_the_list_lacks_are_refused_not_read_by_position(tmp_path):
    """Kaldi-style lines whose ids are not the list's ("utt0" for "0") would, read one per line, make each id its
    reference's first word: refused in one line that names an id. References that merely start with a number
    on some lines are still read by position."""
    records = jsonl_records()
    path = S.write_moses(tmp_path / "test.nbest", records)
    ids = S.write_lines(tmp_path / "text", ["utt0 the cat sat on the mat", "utt1 a dog barked", "utt2 hello world"])
    with pytest.raises(NBestError) as info:
        read_nbest(path, references=ids)
    message = str(info.value)
    assert "3 of 3 are not utterances of the N-best list (e.g. 'utt0'; the list's are like '0')" in message
    assert "\n" not in message
    partly = S.write_lines(tmp_path / "partly", ["0 the cat sat on the mat", "1 a dog barked", "utt2 hello world"])
    with pytest.raises(NBestError, match="1 of 3 are not utterances of the N-best list \\(e.g. 'utt2'"):
        read_nbest(path, references=partly)
    numbers = S.write_lines(tmp_path / "numbers", ["2 cats sat", "a dog barked", "3 birds"])
    table = read_nbest(path, references=numbers)
    assert sorted(set(zip(table.column("utt_id").to_pylist(), table.column("ref").to_pylist()))) == [
        ("0", "2 cats sat"), ("1", "a dog barked"), ("2", "3 birds")
    ]  # fmt: skip
