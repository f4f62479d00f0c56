"""What a run costs an object store, counted request by request by a proxy in front of moto's S3 server
(tests/helpers/s3_proxy.py), and that the cheaper checks keep every verdict.

It used to take about 9 requests per shard written (the summary read each shard's marker, footer and rows
again), and a rerun of a finished run and `dscore verify` several requests per shard (every marker and footer
read; verify every file whole): 2,215 and 2,812 requests for 200 shards. Now a shard is its file's PUT and its
marker's, the summary comes from the markers, and a rerun or verify of a finished folder is a few listings and
the folder's index of the markers it checked, whatever the number of shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main

from helpers import tiny
from helpers.s3_proxy import CountingProxy

SHARDS = 20


def corpus(folder: Path, lines: int) -> str:
    path = folder / "many.txt"
    path.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(lines)))
    return str(path)


def score_args(s3, tmp_path, model: str, lines: int = SHARDS) -> list[str]:
    return ["score", corpus(tmp_path, lines), "--model", model, "--output", s3.uri("out"), "--shard-rows", "1"]


def counted(proxy: CountingProxy, args: list[str], capsys) -> tuple[int, list[str], str]:
    """The command's exit code, the requests it sent and what it printed."""
    start = len(proxy.requests())
    capsys.readouterr()
    rc = main(args)
    return rc, proxy.requests()[start:], capsys.readouterr().out


def test_a_shard_is_written_in_at_most_six_requests(proxy, s3, tiny_model_dir, tmp_path, capsys):
    rc, seen, _ = counted(proxy, score_args(s3, tmp_path, str(tiny_model_dir("bert"))), capsys)
    assert rc == 0
    assert len(seen) / SHARDS <= 6, f"{len(seen) / SHARDS:.1f} requests per shard: {seen}"
    assert not [r for r in seen if "uploads" in r or "uploadId" in r], "multipart uploads of small objects"
    shard_reads = [r for r in seen if r.startswith(("GET", "HEAD")) and ("/rows/part-" in r or "/_done/0" in r)]
    assert not shard_reads, f"the summary read the shards again: {shard_reads[:4]}"
    summary = json.loads(s3.get("out/summary.json"))
    assert summary["rows"] == summary["rows_expected"] == SHARDS and summary["shards"] == SHARDS


def test_a_rerun_of_a_finished_run_and_verify_list_instead_of_reading_each_shard(
    proxy, s3, tiny_model_dir, tmp_path, capsys
):
    args = score_args(s3, tmp_path, str(tiny_model_dir("bert")))
    assert main(args) == 0
    summary = s3.get("out/summary.json")
    rc, rerun, _ = counted(proxy, args, capsys)
    assert rc == 0 and s3.get("out/summary.json") == summary
    assert len(rerun) < SHARDS, f"a rerun of a finished run of {SHARDS} shards sent {len(rerun)} requests: {rerun}"
    rc, verify, printed = counted(proxy, ["verify", s3.uri("out")], capsys)
    assert rc == 0 and printed.strip() == f"OK: {s3.uri('out')}: {SHARDS} shards, {SHARDS} rows"
    assert len(verify) < SHARDS, f"verify of {SHARDS} shards sent {len(verify)} requests: {verify}"


# The verdicts on a damaged S3 folder stay those of a local one: what a listing does not show unchanged is read.

LAST = "00000-000000000003"  # the last of 4 one-row shards


def garbage_of_its_size(s3) -> None:
    key = f"out/rows/part-{LAST}.parquet"
    s3.put(key, b"\0" * len(s3.get(key)))


def marker_counting_3(s3) -> None:
    key = f"out/_done/{LAST}.json"
    s3.put(key, json.dumps({**json.loads(s3.get(key)), "rows": 3}))


def another_shards_file(s3) -> None:
    s3.put(f"out/rows/part-{LAST}.parquet", s3.get("out/rows/part-00000-000000000000.parquet"))


DAMAGE = {  # how -> (damage, what verify says, whether a rerun scores the shard again)
    "garbage of its size in a shard's file": (garbage_of_its_size, "cannot be read", True),
    "a marker counting 3 rows for a shard of 1": (marker_counting_3, "holds 1 rows, its marker says 3", True),
    "another shard's file copied over one": (another_shards_file, "bytes differ", False),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damage_on_s3_is_found_as_on_a_local_disk(how, s3, tiny_model_dir, tmp_path, capsys, caplog):
    damage, says, rescored = DAMAGE[how]
    args = score_args(s3, tmp_path, str(tiny_model_dir("bert")), lines=4)
    assert main(args) == 0
    assert main(["verify", s3.uri("out")]) == 0
    damage(s3)
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"FAILED: {s3.uri('out')}") and any(LAST in x and says in x for x in lines), lines
    if rescored:
        assert main(args) == 0
        assert f"shard {LAST} is scored again" in caplog.text
        assert main(["verify", s3.uri("out")]) == 0


def test_a_deleted_marker_on_s3_is_named_and_the_rerun_scores_its_shard_again(s3, tiny_model_dir, tmp_path, capsys):
    """As on a local disk: the shard is not done, and summary.json counts a row the files no longer hold."""
    args = score_args(s3, tmp_path, str(tiny_model_dir("bert")), lines=4)
    assert main(args) == 0
    s3.client.delete_object(Bucket=s3.name, Key=f"out/_done/{LAST}.json")
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(f"shard {LAST}" in line and "not done" in line for line in lines), lines
    assert "summary.json counts 4 rows, the files hold 3" in lines
    assert main(args) == 0
    assert main(["verify", s3.uri("out")]) == 0


def test_a_folder_of_an_earlier_dscore_keeps_its_full_check(s3, tiny_model_dir, tmp_path, capsys):
    """Markers without the file's MD5 (an earlier dscore's): nothing is taken from a listing that the marker
    cannot prove. A file rewritten with the same rows before a rerun wrote the index is still found by verify."""
    args = score_args(s3, tmp_path, str(tiny_model_dir("bert")), lines=4)
    assert main(args) == 0
    for key in s3.keys("out/_done/"):
        if key.endswith(".json"):
            marker = json.loads(s3.get(key))
            s3.put(key, json.dumps({k: v for k, v in marker.items() if k not in ("file_md5", "row_sums")}))
    s3.client.delete_object(Bucket=s3.name, Key="out/_done/_index.jsonl")
    part = f"out/rows/part-{LAST}.parquet"
    buffer = pa.BufferOutputStream()
    pq.write_table(pq.read_table(pa.BufferReader(s3.get(part))), buffer, compression="gzip")
    s3.put(part, buffer.getvalue().to_pybytes())  # the same rows, not the bytes written
    assert main(args) == 0  # the resume checks rows, as ever: the shard is kept
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(LAST in line and "bytes differ" in line for line in lines), lines


def test_a_damaged_index_is_read_past(s3, tiny_model_dir, tmp_path, capsys, caplog):
    """The index only spares reads: garbage in it, and every marker is read as without one."""
    args = score_args(s3, tmp_path, str(tiny_model_dir("bert")), lines=4)
    assert main(args) == 0
    assert "out/_done/_index.jsonl" in s3.keys("out/_done/")
    s3.put("out/_done/_index.jsonl", "{not json\n")
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 0
    assert "_index.jsonl is damaged" in caplog.text
    assert main(args) == 0 and json.loads(s3.get("out/summary.json"))["rows"] == 4
