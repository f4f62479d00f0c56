"""An object store that stops answering mid-run (503 to every request for a while, from a proxy in front of moto's
S3 server: tests/helpers/s3_proxy.py): a run in this process sends its writes and reads again with backoff and finishes,
rows in == rows out; an outage longer than the budget (`DSCORE_STORAGE_RETRY_S`, `--storage-retry-s`) ends the
run with one `incomplete` line, exit 1, and the same command finishes it once the store is back.

pyarrow's S3 client sends a request again by itself for about 7 s (6 s when nothing listens), so the outages
here last 12 s. Only the shards' and markers' PUTs used to be sent again, not the listings and reads of the
summary, so an outage as the last shard was written stopped the run (exit 1).
"""

from __future__ import annotations

import json

import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import STORAGE_RETRY_ENV

from helpers import tiny

LINES = 8


@pytest.fixture
def args(s3, tiny_model_dir, tmp_path) -> list[str]:
    corpus = tmp_path / "many.txt"
    corpus.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(LINES)))
    model = str(tiny_model_dir("bert"))
    return ["score", str(corpus), "--model", model, "--output", s3.uri("out"), "--shard-rows", "1"]


OUTAGE_S = 12


def shard_file_written(request: str) -> bool:
    return request.startswith("PUT ") and "/rows/part-" in request


def marker_written(request: str) -> bool:
    return request.startswith("PUT ") and "/_done/0" in request


def run(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "after, n",
    [(shard_file_written, 3), (marker_written, LINES)],
    ids=["while writing shards", "from the last marker on"],
)
def test_an_outage_mid_run_is_ridden_out(proxy, s3, args, capsys, caplog, monkeypatch, after, n):
    monkeypatch.setenv(STORAGE_RETRY_ENV, "60")
    proxy.outage(OUTAGE_S, after=after, n=n)
    rc, err = run(args, capsys)
    assert rc == 0, err
    assert proxy.refused > 0, "no request met the outage"
    assert "trying again in" in caplog.text
    summary = json.loads(s3.get("out/summary.json"))
    assert summary["rows"] == summary["rows_expected"] == LINES
    assert main(["verify", s3.uri("out")]) == 0


def test_an_outage_longer_than_the_budget_is_one_incomplete_line(proxy, s3, args, capsys, monkeypatch):
    monkeypatch.setenv(STORAGE_RETRY_ENV, "2")
    proxy.outage(600, after=shard_file_written, n=3)
    rc, err = run(args, capsys)
    lines = [line for line in err.splitlines() if line.startswith("dscore: ")]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("dscore: incomplete:"), err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == lines[0], err
    assert "rerun the same command" in lines[0]
    proxy.outage(0, after=lambda request: True)  # the store is back
    # The lock could not be released in the outage, and its holder (this process) lives on: the log says to delete
    # it when no run uses the folder (a rerun in a new process would take it over once its heartbeat is stale).
    s3.client.delete_object(Bucket=s3.name, Key="out/_lock.json")
    monkeypatch.setenv(STORAGE_RETRY_ENV, "60")
    rc, err = run(args, capsys)
    assert rc == 0, err
    assert json.loads(s3.get("out/summary.json"))["rows"] == LINES
