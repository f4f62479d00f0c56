"""Finding and reading inputs: folders, globs, URIs, formats, compression, ids and shard boundaries."""

from __future__ import annotations

import bz2
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec
from distributed_scoring.io import schema as S
from distributed_scoring.io.inputs import InputError, detect_format, find_inputs
from distributed_scoring.io.sources import Shard, plan_shards, read_units

from helpers.sources import read_all

LINES = ["first line", "", "third ☃ line", "fourth", "fifth", "sixth", "seventh"]


def write_text(path, lines, opener=open):
    with opener(path, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode())
    return path


@pytest.mark.parametrize("shard_rows", [1, 3, 100])
@pytest.mark.parametrize("suffix, opener", [("", open), (".gz", gzip.open), (".bz2", bz2.open), (".zst", None)])
def test_compressed_text_reads_like_plain_text(tmp_path, shard_rows, suffix, opener):
    if opener is None:
        opener = lambda p, mode: pa.CompressedOutputStream(str(p), "zstd")  # noqa: E731
    plain = write_text(tmp_path / "c.txt", LINES)
    packed = write_text(tmp_path / f"d.txt{suffix}", LINES, opener)
    a = read_all(InputSpec((str(plain),), shard_rows=shard_rows))
    b = read_all(InputSpec((str(packed),), shard_rows=shard_rows))
    assert [r[S.TEXT] for r in a] == [r[S.TEXT] for r in b] == LINES
    assert [r[S.ID] for r in b] == [f"d.txt{suffix}:{i}" for i in range(1, 8)]
    plan = plan_shards(InputSpec((str(packed),), shard_rows=shard_rows))
    assert (plan[0].byte_offset is None) == bool(suffix)  # compressed files cannot seek
    assert len(read_units(plan)) == (1 if suffix else len(plan))


def test_folder_glob_and_file_uri_names(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    write_text(corpus / "a.txt", ["a1", "a2"])
    write_text(corpus / "sub" / "b.txt", ["b1"])
    write_text(corpus / "_SUCCESS", ["marker"])
    write_text(corpus / ".hidden.txt", ["hidden"])
    files = find_inputs((str(corpus),))
    assert [f.name for f in files] == ["corpus/a.txt", "corpus/sub/b.txt"]
    assert [f.name for f in find_inputs((str(corpus / "*.txt"),))] == ["corpus/a.txt"]
    assert [f.name for f in find_inputs((str(corpus / "**/*.txt"),))] == ["corpus/a.txt", "corpus/sub/b.txt"]
    uri = f"file://{corpus}/a.txt"
    rows = read_all(InputSpec((uri,)))
    assert [r[S.ID] for r in rows] == ["a.txt:1", "a.txt:2"]
    assert [r[S.ID] for r in read_all(InputSpec((f"file://{corpus}",)))] == [
        "corpus/a.txt:1",
        "corpus/a.txt:2",
        "corpus/sub/b.txt:1",
    ]


def test_missing_inputs_and_name_collisions_are_clear_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        find_inputs((str(tmp_path / "nope.txt"),))
    with pytest.raises(InputError, match="matches no files"):
        find_inputs((str(tmp_path / "*.nope"),))
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    write_text(tmp_path / "x" / "same.txt", ["1"])
    write_text(tmp_path / "y" / "same.txt", ["2"])
    with pytest.raises(InputError, match="share the name 'same.txt'"):
        find_inputs((str(tmp_path / "x" / "same.txt"), str(tmp_path / "y" / "same.txt")))


def test_formats_by_suffix():
    assert [
        detect_format(p) for p in ["a.txt", "a.en", "a.jsonl.gz", "a.ndjson", "a.csv.zst", "a.tsv", "a.parquet"]
    ] == ["text", "text", "jsonl", "jsonl", "csv", "tsv", "parquet"]


@pytest.mark.parametrize("shard_rows", [1, 2, 10])
def test_csv_with_quoted_newlines_and_tsv(tmp_path, shard_rows):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text('key,text\nk1,"a sentence, with a comma"\nk2,"spans\ntwo lines"\n\nk3,plain\nk4,a,b\n')
    rows = read_all(InputSpec((str(csv_path),), id_column="key", shard_rows=shard_rows))
    assert [(r[S.ID], r[S.STATUS]) for r in rows] == [
        ("k1", "ok"),
        ("k2", "ok"),
        ("t.csv:3", "error"),
        ("k3", "ok"),
        ("t.csv:5", "error"),
    ]
    assert rows[1][S.TEXT] == "spans\ntwo lines"
    assert "fields" in rows[4][S.ERROR]
    tsv = tmp_path / "t.tsv"
    tsv.write_text('text\tsource\nhe said "hi\tnews\nplain\tweb\n')
    assert [r[S.TEXT] for r in read_all(InputSpec((str(tsv),), shard_rows=shard_rows))] == ['he said "hi', "plain"]
    with pytest.raises(InputError, match="no text column 'sentence'"):
        plan_shards(InputSpec((str(tsv),), text_column="sentence"))


def test_parquet_row_ranges_span_row_groups(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": [f"s{i}" for i in range(23)]}), path, row_group_size=5)
    rows = read_all(InputSpec((str(path),), shard_rows=7))
    assert [r[S.TEXT] for r in rows] == [f"s{i}" for i in range(23)]
    assert rows[-1][S.ID] == "p.parquet:23"


def test_datasets_folder_saved_to_disk(tmp_path):
    import datasets

    single = tmp_path / "single"
    datasets.Dataset.from_dict({"text": ["x", "y", "z"], "n": [1, 2, 3]}).save_to_disk(str(single))
    assert [(r[S.ID], r[S.TEXT]) for r in read_all(InputSpec((str(single),), shard_rows=2))] == [
        ("single:1", "x"),
        ("single:2", "y"),
        ("single:3", "z"),
    ]
    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["t"]}), "test": datasets.Dataset.from_dict({"text": ["u", "v"]})}
    ).save_to_disk(str(dd))
    assert sorted(r[S.ID] for r in read_all(InputSpec((str(dd),)))) == ["dd/test:1", "dd/test:2", "dd/train:1"]


def test_shard_round_trips_through_json(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text\na\nb\n")
    (shard,) = plan_shards(InputSpec((str(path),)))
    assert Shard.from_json(shard.to_json()) == shard and shard.file.columns == ("text",)
    assert json.loads(shard.to_json())["file"]["fmt"] == "csv"
