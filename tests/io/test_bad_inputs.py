"""The bad-input corpus (tests/data/bad): every file gets a clear answer, never a traceback.

Each file either reads into exactly one row per record, the bad ones error rows with a reason, or is
refused before any work with one `UserError` naming the file and what to do.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import InputSpec
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.io.sources import plan_shards, read_unit, read_units
from distributed_scoring.io.sources.lines import _OpenQuote, _records

from helpers.sources import read_all

BAD = Path(__file__).resolve().parents[1] / "data" / "bad"

# file, spec options, expected (id, status, words in the error) per record
ROWS = [
    (
        "lone_surrogate.jsonl",
        {"id_column": "id"},
        [
            ("a", "ok", None),
            ("b", "error", "lone surrogate escape \\ud800"),
            ("c", "ok", None),  # a surrogate pair is one real character
            ("lone_surrogate.jsonl:4", "error", "id holds a lone surrogate"),
            ("e", "ok", None),
        ],
    ),
    (
        "stray_quote.csv",
        {"id_column": "id"},
        [
            ("1", "ok", None),
            ("stray_quote.csv:2", "error", "malformed CSV quoting"),  # "closed early" then more
            ("3", "ok", None),  # a quote inside an unquoted field is a literal, as the csv module reads it
            ("4", "ok", None),
            ("5", "ok", None),
        ],
    ),
]

# file, spec options, words the one-line refusal must hold
REFUSED = [
    ("unterminated_quote.csv", {}, "line 3 opens a quoted CSV field that is never closed"),
    ("cr_only.txt", {}, "CR-only"),
    ("binary.dat", {}, "is not a text file"),  # it was diagnosed as CR-only line endings
    ("utf16_bom.txt", {}, "is UTF-16 text (it starts with a UTF-16 byte-order mark) and dscore reads UTF-8: re-encode"),
    ("truncated.txt.gz", {}, "damaged or truncated"),
    ("not_gzip.txt.gz", {}, "incorrect header check"),
    ("truncated.jsonl.bz2", {}, "damaged or truncated"),
    ("garbage.parquet", {}, "not a readable Parquet file"),
    ("truncated.parquet", {}, "not a readable Parquet file"),
]


def test_every_file_of_the_corpus_is_in_a_table():
    assert sorted(p.name for p in BAD.iterdir()) == sorted(name for name, *_ in ROWS + REFUSED)


@pytest.mark.parametrize("shard_rows", [1, 2, 100])
@pytest.mark.parametrize("name, options, expected", ROWS, ids=[r[0] for r in ROWS])
def test_bad_records_become_error_rows_and_rows_in_equal_records_in(name, options, expected, shard_rows):
    rows = read_all(InputSpec((str(BAD / name),), shard_rows=shard_rows, **options))
    assert [(r[S.ID], r[S.STATUS]) for r in rows] == [(i, status) for i, status, _ in expected]
    for row, (_, _, words) in zip(rows, expected):
        assert (row[S.ERROR] is None) == (words is None)
        assert words is None or words in row[S.ERROR]


@pytest.mark.parametrize("name, options, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_unreadable_files_are_refused_before_work_in_one_line(name, options, words):
    with pytest.raises(UserError) as caught:
        plan_shards(InputSpec((str(BAD / name),), **options))
    message = str(caught.value)
    assert name in message and words in message and "\n" not in message


def test_a_quoted_field_may_still_span_lines_and_close(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('id,text\n1,"one\n""two"",\nthree"\n2,"a"\n')
    rows = read_all(InputSpec((str(path),), id_column="id"))
    assert [(r[S.ID], r[S.TEXT]) for r in rows] == [("1", 'one\n"two",\nthree'), ("2", "a")]


def test_the_cli_answers_a_damaged_file_with_one_line_and_exit_2(tmp_path, tiny_model_dir, capsys):
    model = tiny_model_dir("bert")
    capsys.readouterr()  # building the tiny model writes progress bars
    rc = main(["score", str(BAD / "truncated.txt.gz"), "--model", str(model), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "truncated.txt.gz" in err and "damaged or truncated" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_file_damaged_after_planning_is_a_clear_error_when_read(tmp_path):
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(b"one\ntwo\n"))
    spec = InputSpec((str(path),))
    (unit,) = read_units(plan_shards(spec))
    path.write_bytes((BAD / "truncated.txt.gz").read_bytes())
    with pytest.raises(UserError, match="damaged or truncated"):
        list(read_unit(unit, spec))


@pytest.mark.parametrize("name", ["lone_surrogate.jsonl", "stray_quote.csv"])
def test_the_cli_scores_the_good_rows_and_keeps_the_bad_as_error_rows(name, tmp_path, tiny_model_dir, capsys):
    ((_, _, expected),) = [r for r in ROWS if r[0] == name]
    out = tmp_path / "out"
    rc = main(
        ["score", str(BAD / name), "--model", str(tiny_model_dir("bert")), "--output", str(out), "--id-column", "id"]
    )
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["rows"] == len(expected)
    assert summary["errors"] == sum(status == "error" for _, status, _ in expected)
    assert pq.read_table(out / "rows").num_rows == len(expected)


def test_a_line_nested_deeper_than_json_reads_is_an_error_row(tmp_path, tiny_model_dir, capsys):
    """Arrays 3,000 deep exceed the depth Python's JSON reader follows (a RecursionError, not a JSONDecodeError):
    such a line, first (where the columns are checked) or later, is an error row as other invalid JSON is.
    Written here rather than kept in the corpus, whose files the trial numbers."""
    deep = "[" * 3000 + "]" * 3000
    path = tmp_path / "deep.jsonl"
    path.write_text(
        f'{deep}\n{{"id": "b", "text": "fine"}}\n{{"id": "c", "text": {deep}}}\n{{"id": "d", "text": "ok"}}\n'
    )
    rows = read_all(InputSpec((str(path),), id_column="id", shard_rows=2))
    assert [(r[S.ID], r[S.STATUS]) for r in rows] == [("deep.jsonl:1", "error"), ("b", "ok"), ("deep.jsonl:3", "error"),
                                                      ("d", "ok")]  # fmt: skip
    assert all("invalid JSON: maximum recursion depth exceeded" in r[S.ERROR] for r in rows if r[S.STATUS] == "error")
    out = tmp_path / "out"
    args = ["score", str(path), "--model", str(tiny_model_dir("bert")), "--output", str(out), "--id-column", "id"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["errors"]) == (4, 2) and main(args) == 0  # the rerun finds it done


def test_csv_records_end_where_the_csv_module_ends_them():
    """Random lines of quotes, commas and letters: where a record ends agrees with `csv.reader`."""
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join("".join(rng.choice('ab,"" ') for _ in range(rng.randint(0, 8))) + "\n" for _ in range(4))
        try:
            expected = len(list(csv.reader(io.StringIO(text))))
            records = list(_records(io.BytesIO(text.encode()), "csv"))
        except (csv.Error, _OpenQuote):
            continue  # a quote open at the end of the input: planning refuses the file
        assert len(records) == expected, text
        assert all(len(list(csv.reader(io.StringIO(raw.decode())))) <= 1 for _, raw in records), text  # 0: blank
