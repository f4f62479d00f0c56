"""Input bombs: a line of any length is an error row read in bounded pieces, a DMS table is checked a block at a
time before it is held whole, and the real CLI given the issue's bombs (a 9 MB `.gz` of one 2 GiB line, a 1.7 MB
`.csv.gz` of 256 MiB naming a mutant twice) stays within its 1.5 GiB of peak RSS (benchmarks/input_bombs.py
builds the bombs and measures a `dscore` subprocess's own peak)."""

from __future__ import annotations

import gzip
import io
import json
import random
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.io.dms import DMSError, read_reference, read_table, refuse_repeats, strings_of, table_batches
from distributed_scoring.io.sources import plan_shards
from distributed_scoring.io.sources.lines import MAX_RECORD_BYTES, _OpenQuote, _Oversized, _records

from helpers.sources import read_all

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import input_bombs  # noqa: E402


def _whole(records: list) -> list:
    return [(offset, ("over", r.n_bytes) if isinstance(r, _Oversized) else r) for offset, r in records]


def test_records_read_in_pieces_are_the_records_read_whole_or_their_length_past_the_limit():
    """Random lines of quotes, commas, CRs and letters, read with a limit of 1 to 12 bytes (pieces that cut lines
    and quoted fields anywhere) against the same stream read with no limit in reach (whole lines, as
    `test_bad_inputs` checks against `csv.reader`): the same records at the same offsets, each over the limit as
    its length and its first bytes; the same unclosed quote, on the same line."""
    rng = random.Random(0)
    oversized = 0
    for _ in range(5000):
        fmt = rng.choice(["csv", "text", "jsonl"])
        parts = ["a", ",", '"', "\r", "\n", "\r\n", "xyz" * rng.randint(0, 5)]
        data = "".join(rng.choice(parts) for _ in range(rng.randint(0, 40))).encode()
        limit = rng.randint(1, 12)
        try:
            whole = list(_records(io.BytesIO(data), fmt, limit=1 << 30))
        except _OpenQuote as exc:
            with pytest.raises(_OpenQuote) as caught:
                list(_records(io.BufferedReader(io.BytesIO(data)), fmt, limit=limit))
            assert caught.value.line == exc.line
            continue
        pieces = list(_records(io.BufferedReader(io.BytesIO(data)), fmt, limit=limit))
        assert _whole(pieces) == [(o, ("over", len(r)) if len(r) > limit else r) for o, r in whole], (data, limit)
        for (_, record), (_, raw) in zip(pieces, whole):
            if isinstance(record, _Oversized):
                oversized += 1
                assert record.head and raw.startswith(record.head)
    assert oversized > 1000


@pytest.mark.parametrize("fmt", ["text", "jsonl", "csv", "tsv"])
def test_a_record_over_the_limit_is_an_error_row_naming_it_and_its_neighbours_are_read(tmp_path, fmt):
    long = "a" * (3 * MAX_RECORD_BYTES)
    records = ["a dog", long, "the fox"]
    if fmt == "text":
        lines = records
    elif fmt == "jsonl":
        lines = [json.dumps({"text": r}) for r in records]
    else:
        lines = ["text"] + records  # a header, then one field per record
    path = tmp_path / f"t.{fmt}.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    rows = read_all(InputSpec((str(path),), shard_rows=2))
    assert [(r[S.TEXT], r[S.STATUS]) for r in rows] == [("a dog", "ok"), (None, "error"), ("the fox", "ok")]
    size = len(lines[2 if fmt in ("csv", "tsv") else 1])
    assert f"record is {size:,} bytes long, over the limit of {MAX_RECORD_BYTES:,} bytes" in rows[1][S.ERROR]


def test_a_record_at_the_limit_is_read(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"a" * MAX_RECORD_BYTES + b"\r\n" + b"b" * (MAX_RECORD_BYTES + 1) + b"\n")
    rows = read_all(InputSpec((str(path),)))
    assert [len(r[S.TEXT] or "") for r in rows] == [MAX_RECORD_BYTES, 0] and rows[1][S.STATUS] == "error"


def test_a_header_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_bytes(b"text," + b"x" * MAX_RECORD_BYTES + b"\nhello,x\n")
    with pytest.raises(UserError, match=f"the header row is {MAX_RECORD_BYTES + 5:,} bytes long, over the limit"):
        plan_shards(InputSpec((str(path),)))


def test_a_cr_only_file_longer_than_the_limit_is_still_refused(tmp_path):
    """Its lines read as one record over the limit; the CR check reads that record's first bytes."""
    path = tmp_path / "mac.txt"
    path.write_bytes(b"a line\r" * (MAX_RECORD_BYTES // 4))
    with pytest.raises(UserError, match="CR-only"):
        plan_shards(InputSpec((str(path),)))


def test_score_of_a_2_gib_line_is_an_error_row_within_the_memory_bound(tmp_path, tiny_model_dir):
    """The issue's bomb: 9.4 MB of gzip holding one 2 GiB line between two short ones. The run exits 0 with
    three rows, the long one an error naming the limit; the process's peak RSS stays under 1.5 GiB (it was
    an ArrowCapacityError traceback after over 6 GiB)."""
    run = input_bombs.score_line_bomb(tmp_path, tiny_model_dir("bert"))
    assert run.code == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    rows = pq.read_table(tmp_path / "out" / "rows", columns=[S.ID, S.STATUS, S.ERROR]).to_pylist()
    assert [(r[S.ID], r[S.STATUS]) for r in rows] == [
        ("bomb.txt.gz:1", "ok"),
        ("bomb.txt.gz:2", "error"),
        ("bomb.txt.gz:3", "ok"),
    ]
    assert f"record is {2 << 30:,} bytes long, over the limit of {MAX_RECORD_BYTES:,} bytes" in rows[1][S.ERROR]
    assert run.peak_rss < input_bombs.RSS_BOUND, f"peak RSS {run.peak_rss / 2**20:.0f} MiB"


def _streamed_repeats(uri: str) -> None:
    refuse_repeats((m for batch in table_batches(uri, ["mutant"]) for m in strings_of(batch, "mutant")), uri)


@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "jsonl", "parquet"])
def test_a_repeat_past_the_first_blocks_is_found_by_the_streamed_check(tmp_path, fmt):
    """Four blocks' worth of distinct mutants, then the first again: the check reads block after block and names
    the row, as a check of the whole table would."""
    n = 4 * (1 << 20) // 12
    mutants = [f"A{i + 1}G" for i in range(n)] + ["A1G"]
    path = tmp_path / f"t.{fmt}"
    table = pa.table({"mutant": mutants, "DMS_score": [0.5] * len(mutants)})
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=100_000)
    else:
        lines = [json.dumps(r) for r in table.to_pylist()] if fmt == "jsonl" else ["mutant,DMS_score"]
        lines += [f"{m},0.5" for m in mutants] if fmt != "jsonl" else []
        text = "\n".join(lines) + "\n"
        path.write_bytes(gzip.compress(text.encode(), 1) if fmt.endswith(".gz") else text.encode())
    with pytest.raises(DMSError, match=f"'A1G' appears twice \\(again on row {n + 1}\\)"):
        _streamed_repeats(str(path))


def test_a_csv_column_that_turns_to_words_after_the_first_block_reads_as_a_whole_read_does(tmp_path):
    """The streamed check reads only the mutants, as strings: a `DMS_score` of numbers for a few MiB, then `high`,
    which one block's inference would take for a double and then fail on, is the whole read's string column."""
    n = 300_000
    path = tmp_path / "t.csv"
    path.write_text("mutant,DMS_score\n" + "".join(f"A{i + 1}G,0.5\n" for i in range(n)) + "K1R,high\n")
    _streamed_repeats(str(path))
    assert read_table(str(path)).schema.field("DMS_score").type == pa.string()


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_table_line_over_the_limit_is_refused_in_one_line_before_it_is_held(tmp_path, fmt):
    long = json.dumps({"mutant": "A1G", "note": "x" * (3 * MAX_RECORD_BYTES)}) if fmt == "jsonl" else "x" * (3 << 20)
    lines = ['{"mutant": "K2R"}', long] if fmt == "jsonl" else ["mutant,note", "K2R,a", long]
    path = tmp_path / f"t.{fmt}.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 1))
    with pytest.raises(DMSError) as caught:
        _streamed_repeats(str(path))
    assert f"line {len(lines)} is over {MAX_RECORD_BYTES:,} bytes" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_reference_read_a_block_at_a_time_finds_every_repeated_id(tmp_path):
    reference = tmp_path / "reference.csv"
    rows = "".join(f"A_{i},A_{i}.csv,MKT,Human\n" for i in range(200_000))
    reference.write_text("DMS_id,DMS_filename,target_seq,taxon\n" + rows + "A_7,other.csv,MKT,Human\n")
    with pytest.raises(DMSError, match="the DMS_id\\(s\\) \\['A_7'\\] appear more than once"):
        read_reference(str(reference), str(tmp_path))


def test_a_jsonl_reference_of_numbers_reads_as_a_whole_read_did(tmp_path):
    """Each block parsed alone, with the types its values have: numeric ids are the strings they print as."""
    reference = tmp_path / "reference.jsonl"
    rows = [{"DMS_id": i, "DMS_filename": f"{i}.csv", "target_seq": "mkt"} for i in range(3)]
    reference.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assays = read_reference(str(reference), str(tmp_path))
    assert [(a.id, a.table, a.target_seq) for a in assays] == [(str(i), f"{tmp_path}/{i}.csv", "MKT") for i in range(3)]


def test_variants_of_a_256_mib_table_naming_a_mutant_twice_is_refused_in_one_line_within_the_memory_bound(
    tmp_path, tiny_protein_dir
):
    """The issue's bomb: 25 million short rows, the first repeat on row 571. One line, exit 2, and a peak RSS under
    1.5 GiB (it was over 3 GiB, the whole table read before any check)."""
    run = input_bombs.variants_table_bomb(tmp_path, tiny_protein_dir("bert"))
    assert run.code == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines() == [
        f"dscore: error: {tmp_path / 'bomb.csv.gz'}: the mutant 'M1A' appears twice (again on row 571); each variant "
        "must be named once"
    ]
    assert run.peak_rss < input_bombs.RSS_BOUND, f"peak RSS {run.peak_rss / 2**20:.0f} MiB"


def test_an_nbest_line_over_the_limit_is_refused_without_being_read_whole(tmp_path):
    """rescore's readers (N-best lists, references) read lines in bounded pieces too: one line, not a 2 GiB
    string (they read whole lines before)."""
    from distributed_scoring.io.nbest import read_nbest
    from distributed_scoring.io.nbest_records import NBestError

    path = tmp_path / "n.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"utt_id": "u1", "hyp_id": 0, "text": "a dog"}\n{"utt_id": "u2", "text": "')
        for _ in range(256):
            f.write(b"a" * (1 << 20))  # 256 MiB on one line
        f.write(b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(NBestError, match=r"line 2 is over 1,048,576 bytes"):
            read_nbest(str(path))
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak_mib < 16, f"reading held {peak_mib:.0f} MiB at its peak"
