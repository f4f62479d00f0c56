"""N-best readers: ESPnet JSON, JSONL, Parquet, reference files; malformed input is refused by place."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.errors import UserError
from distributed_scoring.io import nbest
from distributed_scoring.io.nbest import NBestError, read_nbest, read_references

ESPNET = {
    "1272-128104-0000": {
        "ref": "mister quilter is the apostle",
        "hyp_2": {"score": -10.5, "text": " mister quillter is the apostle"},
        "hyp_1": {"score": -9.25, "text": " mister quilter is the apostle"},
        "hyp_10": {"score": -20.0, "text": " mister quilter is a apostle"},
    },
    "1272-128104-0001": {
        "hyp_1": {"score": -3.0, "text": "nor is mister quilter's manner"},
        "ref": "nor is mister quilter's manner",
    },
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def rows(table):
    return [(r["utt_id"], r["hyp_id"], r["text"], r["score"], r["ref"]) for r in table.to_pylist()]


def test_espnet_json(tmp_path):
    path = tmp_path / "dev.am.json"
    path.write_text(json.dumps(ESPNET))
    table = read_nbest(str(path))
    assert table.schema == nbest.NBEST_SCHEMA
    assert rows(table) == [
        ("1272-128104-0000", 1, "mister quilter is the apostle", -9.25, "mister quilter is the apostle"),
        ("1272-128104-0000", 2, "mister quillter is the apostle", -10.5, "mister quilter is the apostle"),
        ("1272-128104-0000", 10, "mister quilter is a apostle", -20.0, "mister quilter is the apostle"),
        ("1272-128104-0001", 1, "nor is mister quilter's manner", -3.0, "nor is mister quilter's manner"),
    ]
    assert read_references(str(path)) == {u: e["ref"] for u, e in ESPNET.items()}


def test_espnet_json_compressed_and_without_references(tmp_path):
    document = {u: {k: v for k, v in e.items() if k != "ref"} for u, e in ESPNET.items()}
    path = tmp_path / "test.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    table = read_nbest(str(path))
    assert table.column("ref").null_count == table.num_rows
    with pytest.raises(NBestError, match=r"2 utterances have no reference .*'1272-128104-0000'.*reference file"):
        nbest.require_references(table, "test")


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"hyp_1": {"score": -1.0}}, r"hyp_1.*`text` is missing"),
        ({"hyp_1": {"text": "a b"}}, r"hyp_1.*`score` is missing or not a number"),
        ({"hyp_1": {"text": "a b", "score": "-1.5"}}, r"`score` is missing or not a number \(got '-1.5'\)"),
        ({"hyp_1": {"text": "a b", "score": float("nan")}}, r"`score` is nan"),
        ({"hyp_1": {"text": "   ", "score": -1.0}}, r"`text` is empty"),
        ({"hyp_one": {"text": "a", "score": -1.0}}, r"hyp_one: hypothesis keys must read hyp_<rank>"),
        ({"hyp_1": ["a", -1.0]}, r"expected an object with `score` and `text`"),
        ({"ref": 3, "hyp_1": {"text": "a", "score": -1.0}}, r"`ref` is not a string"),
    ],
)
def test_malformed_espnet_entries_are_refused_by_place(tmp_path, entry, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"good": ESPNET["1272-128104-0001"], "utt-7": entry}))
    with pytest.raises(NBestError, match=message) as info:
        read_nbest(str(path))
    assert "utt-7" in str(info.value) and "bad.json" in str(info.value)


def test_repeated_json_key_is_refused(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"u": {"hyp_1": {"text": "a", "score": -1}, "hyp_1": {"text": "b", "score": -2}}}')
    with pytest.raises(NBestError, match=r"\['hyp_1'\] appear twice"):
        read_nbest(str(path))


def test_jsonl_with_references_on_one_row_and_from_a_tsv(tmp_path):
    records = [
        {"utt_id": "b", "hyp_id": 2, "text": "x y", "score": -2},
        {"utt_id": "a", "hyp_id": 1, "text": "p q", "score": -1.5, "ref": "p q"},
        {"utt_id": "b", "hyp_id": 1, "text": "x z", "score": -1, "seq_len": 3},
        {"utt_id": "a", "hyp_id": 2, "text": "p r", "score": -4},
    ]
    path = write_jsonl(tmp_path / "n.jsonl", records)
    table = read_nbest(path)
    assert [(r[0], r[1], r[4]) for r in rows(table)] == [
        ("b", 1, None),
        ("b", 2, None),
        ("a", 1, "p q"),
        ("a", 2, "p q"),
    ]
    assert table.column("seq_len").to_pylist() == [3, None, None, None]
    tsv = tmp_path / "refs.tsv"
    tsv.write_text("utt_id\tref\nb\tx  z \na\tp q\nc\tunused\n")
    assert read_references(str(tsv)) == {"b": "x  z", "a": "p q", "c": "unused"}
    with_refs = read_nbest(path, references=str(tsv))
    assert with_refs.column("ref").to_pylist() == ["x  z", "x  z", "p q", "p q"]


def test_conflicting_references_are_refused(tmp_path):
    records = [
        {"utt_id": "a", "hyp_id": 1, "text": "p", "score": -1, "ref": "p q"},
        {"utt_id": "a", "hyp_id": 2, "text": "q", "score": -2, "ref": "p r"},
    ]
    with pytest.raises(NBestError, match=r"utterance 'a': its rows give 2 different references"):
        read_nbest(write_jsonl(tmp_path / "n.jsonl", records))
    refs = tmp_path / "refs.jsonl"
    write_jsonl(refs, [{"utt_id": "a", "ref": "something else"}])
    with pytest.raises(NBestError, match=r"the N-best list says 'p q', .*refs.jsonl says 'something else'"):
        read_nbest(write_jsonl(tmp_path / "m.jsonl", records[:1]), references=str(refs))


def test_jsonl_problems_are_all_listed_with_their_lines(tmp_path):
    records = [
        {"utt_id": "a", "hyp_id": 1, "text": "p", "score": -1},
        {"utt_id": "a", "hyp_id": 1, "text": "q", "score": -2},
        {"utt_id": "a", "hyp_id": "2", "text": "q", "score": -2},
        {"hyp_id": 3, "text": "q", "score": -2},
        {"utt_id": "b", "hyp_id": 1, "text": "q", "score": True},
    ]
    with pytest.raises(NBestError) as info:
        read_nbest(write_jsonl(tmp_path / "n.jsonl", records))
    message = str(info.value)
    assert "4 problems" in message
    assert "line 2: utterance 'a' already has hypothesis 1 (" in message and "line 1)" in message
    assert "line 3: utterance 'a': `hyp_id` is missing or not an integer rank (got '2')" in message
    assert "line 4: `utt_id` is missing" in message
    assert "line 5: utterance 'b' hypothesis 1: `score` is missing or not a number (got True)" in message
    assert isinstance(info.value, UserError)


def test_bad_json_line_names_its_line(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text('{"utt_id": "a", "hyp_id": 1, "text": "p", "score": -1}\n{"utt_id": \n')
    with pytest.raises(NBestError, match=r"n.jsonl line 2 is not a JSON record"):
        read_nbest(str(path))


def test_a_line_nested_deeper_than_json_reads_is_refused_by_place(tmp_path):
    """Arrays 3,000 deep exceed the depth Python's JSON reader follows: refused as any malformed line or document
    is, not a RecursionError."""
    deep = "[" * 3000 + "]" * 3000
    path = tmp_path / "n.jsonl"
    path.write_text(f'{{"utt_id": "a", "hyp_id": 1, "text": "p", "score": -1}}\n{{"utt_id": "a", "text": {deep}}}\n')
    with pytest.raises(NBestError, match=r"n.jsonl line 2 is not a JSON record \(maximum recursion depth"):
        read_nbest(str(path))
    (tmp_path / "n.json").write_text(f'{{"utts": {deep}}}')
    with pytest.raises(NBestError, match=r"n.json is not one JSON document \(maximum recursion depth"):
        read_nbest(str(tmp_path / "n.json"))


def test_a_file_read_as_mlm_scoring_json_that_is_no_json_says_so(tmp_path):
    """The cause named, not ESPnet: the file is no JSON document, which the format asked for is; one object per
    line is told to be JSONL."""
    moses = tmp_path / "test.nbest"
    moses.write_text("0 ||| the cat ||| F0= -1 ||| -1\n")
    with pytest.raises(NBestError) as info:
        read_nbest(str(moses), fmt="mlm-scoring")
    message = str(info.value)
    assert "test.nbest is not one JSON document (Extra data" in message and "which mlm-scoring's N-best JSON" in message
    assert "ESPnet" not in message and "JSONL" not in message
    lines = write_jsonl(tmp_path / "n.txt", [{"utt_id": "a", "hyp_id": 1, "text": "p", "score": -1}] * 2)
    with pytest.raises(
        NBestError, match=r"it holds a JSON object per line: JSONL \(a .jsonl file, or --format jsonl\)"
    ):
        read_nbest(lines, fmt="mlm-scoring")
    (tmp_path / "refs.json").write_text("the cat\n")
    with pytest.raises(NBestError, match=r"refs.json is not one JSON document .*which a .json reference file"):
        read_references(str(tmp_path / "refs.json"))


def test_parquet_round_trip_and_integer_ids(tmp_path):
    table = pa.table(
        {
            "utt_id": [7, 7, 3],
            "hyp_id": [2, 1, 1],
            "text": ["a b", "a c", "d"],
            "score": [-2.0, -1.0, -0.5],
            "ref": ["a c", None, "d"],
            "extra": [1, 2, 3],
        }
    )
    path = tmp_path / "n.parquet"
    pq.write_table(table, path)
    got = read_nbest(str(path))
    assert rows(got) == [("7", 1, "a c", -1.0, "a c"), ("7", 2, "a b", -2.0, "a c"), ("3", 1, "d", -0.5, "d")]
    pq.write_table(pa.table({"utt_id": ["u"], "ref": ["r"]}), tmp_path / "refs.parquet")
    assert read_references(str(tmp_path / "refs.parquet")) == {"u": "r"}


def test_parquet_with_a_null_score_is_refused(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"utt_id": ["u", "u"], "hyp_id": [1, 2], "text": ["a", "b"], "score": [-1.0, None]}), path)
    with pytest.raises(NBestError, match=r"n.parquet row 2: utterance 'u' hypothesis 2: `score` is missing"):
        read_nbest(str(path))


def test_unknown_format_and_duplicate_reference_are_refused(tmp_path):
    (tmp_path / "n.txt").write_text("just some words\n")  # the format is told by content, not by name
    with pytest.raises(NBestError, match="cannot tell the format"):
        read_nbest(str(tmp_path / "n.txt"))
    path = tmp_path / "refs.tsv"
    path.write_text("a\tx\na\ty\n")
    with pytest.raises(NBestError, match=r"line 2: utterance 'a' already has a reference \(.*line 1\)"):
        read_references(str(path))


def test_unique_texts_spans_tables():
    a = nbest.nbest_table(
        [{"utt_id": "u", "hyp_id": 1, "text": " x ", "score": 0}, {"utt_id": "u", "hyp_id": 2, "text": "y", "score": 0}]
    )
    b = nbest.nbest_table([{"utt_id": "v", "hyp_id": 1, "text": "x", "score": 0}])
    assert nbest.unique_texts(a, b) == ["x", "y"]
