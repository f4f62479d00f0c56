"""Every input kind and the run folder on a real S3 API (moto's server on loopback, `AWS_ENDPOINT_URL`):
the rows equal a local run's, joined by id; a rerun resumes; another run is refused; verify says OK; a
`datasets` folder on s3 is read from s3; the requests a shard costs; the URIs refused in one line.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main

import tiny
from cli_helpers import refusal


def embedded_env() -> dict:
    """A driver that starts its own Ray (never a cluster the shell points at)."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DSCORE_RAY_ADDRESS")}


LINES = [tiny.CORPUS[i % len(tiny.CORPUS)] + f" {i}" for i in range(7)]


def inputs(folder: Path) -> dict[str, Path]:
    """The same rows as text, gzip'd text, JSONL and Parquet (ids from a column where the format has one)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.txt").write_text("".join(f"{line}\n" for line in LINES))
    (folder / "c.txt.gz").write_bytes(gzip.compress((folder / "c.txt").read_bytes()))
    (folder / "c.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(LINES)))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(LINES))], "text": LINES}), folder / "c.parquet")
    return {p.name: p for p in folder.iterdir()}


def pll_by_id(table: pa.Table) -> dict[str, float]:
    return dict(zip(table.column("id").to_pylist(), table.column("pll").to_pylist()))


def score(source: str, model: str, output: str, *extra: str) -> int:
    ids = ["--id-column", "id"] if source.endswith((".jsonl", ".parquet")) else []
    return main(["score", source, "--model", model, "--output", output, "--shard-rows", "2", *ids, *extra])


@pytest.mark.parametrize("name", ["c.txt", "c.txt.gz", "c.jsonl", "c.parquet"])
def test_each_input_kind_from_s3_to_s3_scores_like_a_local_run(name, s3, tiny_model_dir, tmp_path, capsys):
    model = str(tiny_model_dir("bert"))
    local = inputs(tmp_path / "in")[name]
    assert score(str(local), model, str(tmp_path / "local")) == 0
    source = f"{s3.upload(local, 'in')}/{name}"  # s3://bucket/in/<name>
    assert score(source, model, s3.uri("out")) == 0
    expected = pll_by_id(pq.read_table(tmp_path / "local" / "rows"))
    got = pll_by_id(pq.read_table(s3.uri("out/rows/")))
    if name.startswith("c.txt"):  # ids name the file: the same rows under the s3 file's name
        expected = {k.split(":")[-1]: v for k, v in expected.items()}
        got = {k.split(":")[-1]: v for k, v in got.items()}
    assert got.keys() == expected.keys() and all(abs(got[k] - expected[k]) < 1e-6 for k in got)
    local_summary = json.loads((tmp_path / "local" / "summary.json").read_text())
    summary = json.loads(s3.get("out/summary.json"))
    assert summary["rows"] == local_summary["rows"] == len(LINES)
    assert abs(summary["pppl_token"] - local_summary["pppl_token"]) < 1e-6
    assert not [key for key in s3.keys("out/") if key.endswith((".tmp", "_lock.json", "/"))]


def test_a_rerun_resumes_another_run_is_refused_and_verify_says_ok(s3, tiny_model_dir, tmp_path, capsys):
    model = str(tiny_model_dir("bert"))
    source = f"{s3.upload(inputs(tmp_path / 'in')['c.jsonl'], 'in')}/c.jsonl"
    assert score(source, model, s3.uri("out")) == 0
    written = {key: s3.get(key) for key in s3.keys("out/rows/")}
    assert score(source, model, s3.uri("out")) == 0
    assert {key: s3.get(key) for key in s3.keys("out/rows/")} == written  # nothing scored again
    line = refusal(capsys, ["score", source, "--model", model, "--output", s3.uri("out"), "--id-column", "id",
                            "--shard-rows", "2", "--dtype", "float64"])  # fmt: skip
    assert "holds results of a different run" in line and "dtype" in line
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_shard_costs_a_few_requests_one_put_each_no_rename(s3, moto_server, tiny_model_dir, tmp_path):
    """Before: about 17.5 requests per shard (a multipart upload of 3 requests per object, a copy and a delete
    for each rename, a folder-marker PUT, every shard read again for the summary). Measured now: 7.3."""
    model = str(tiny_model_dir("bert"))
    corpus = tmp_path / "many.txt"
    corpus.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(20)))
    before = len(moto_server.requests())
    assert main(["score", str(corpus), "--model", model, "--output", s3.uri("out"), "--shard-rows", "1"]) == 0
    seen = moto_server.requests()[before:]
    assert not [r for r in seen if "?uploads" in r or "uploadId" in r], "multipart uploads of small objects"
    assert len([r for r in seen if r.startswith("PUT")]) <= 2 * 20 + 4  # a shard, its marker; _run, summary, lock
    assert len([r for r in seen if r.startswith("DELETE")]) <= 1  # the lock, no rename's delete
    assert len(seen) / 20 <= 10, f"{len(seen) / 20:.1f} requests per shard"


def test_a_datasets_folder_on_s3_is_read_from_s3_never_from_a_local_folder_of_its_name(
    s3, tiny_model_dir, tmp_path, monkeypatch
):
    """Before: the scheme was stripped and `<bucket>/hfds` read from the local disk (with such a folder present,
    exit 0 with its 3 rows instead of the 60 on s3)."""
    from datasets import Dataset

    Dataset.from_dict({"text": [f"{tiny.CORPUS[i % len(tiny.CORPUS)]} {i}" for i in range(6)]}).save_to_disk(
        tmp_path / "hfds"
    )
    source = s3.upload(tmp_path / "hfds", "nightly/hfds")
    monkeypatch.chdir(tmp_path)
    Dataset.from_dict({"text": ["a decoy", "on local", "disk"]}).save_to_disk(tmp_path / s3.name / "nightly" / "hfds")
    out = tmp_path / "out"
    assert main(["score", source, "--model", str(tiny_model_dir("bert")), "--output", str(out)]) == 0
    texts = pq.read_table(out / "rows").column("text").to_pylist()
    assert len(texts) == 6 and "a decoy" not in texts


@pytest.mark.parametrize(
    "uri, says",
    [
        ("s3://{bucket}//x", "empty path component"),
        # the server's own endpoint, so that only the query is wrong: it names both variables
        ("s3://{bucket}/x?endpoint_override={host}&scheme=http", "AWS_ENDPOINT_URL_S3"),
    ],
)
def test_uris_that_joins_would_break_are_refused_in_one_line(
    uri, says, s3, moto_server, tiny_model_dir, tmp_path, capsys
):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\n")
    output = uri.format(bucket=s3.name, host=moto_server.endpoint.split("://", 1)[1])
    line = refusal(capsys, ["score", str(corpus), "--model", str(tiny_model_dir("bert")), "--output", output])
    assert says in line


def test_verbose_says_which_endpoint_serves_a_bucket(s3, tiny_model_dir, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\n")
    dscore = str(Path(sys.executable).with_name("dscore"))
    argv = [dscore, "--verbose", "score", str(corpus), "--model", str(tiny_model_dir("bert")), "--output", s3.uri("o")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"s3://{s3.name}: endpoint http://127.0.0.1:" in done.stderr and "(AWS_ENDPOINT_URL)" in done.stderr


def test_training_into_s3_is_refused_in_one_line(s3, tiny_model_dir, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"{line}\n" for line in LINES * 4))
    args = [
        "train",
        "pmlm",
        "--data",
        str(corpus),
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        s3.uri("trained"),
    ]
    assert "not an object store" in refusal(capsys, args)


@pytest.mark.ray
def test_a_run_on_ray_from_s3_to_s3_gives_the_in_process_rows(s3, tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("bert"))
    source = f"{s3.upload(inputs(tmp_path / 'in')['c.jsonl'], 'in')}/c.jsonl"
    assert score(source, model, s3.uri("local")) == 0
    dscore = str(Path(sys.executable).with_name("dscore"))
    argv = [dscore, "score", source, "--model", model, "--output", s3.uri("ray"), "--shard-rows", "2"]
    done = subprocess.run([*argv, "--id-column", "id", "--ray"], capture_output=True, text=True, env=embedded_env())
    assert done.returncode == 0, done.stderr[-3000:]
    expected, got = pll_by_id(pq.read_table(s3.uri("local/rows/"))), pll_by_id(pq.read_table(s3.uri("ray/rows/")))
    assert got.keys() == expected.keys() and all(abs(got[k] - expected[k]) < 1e-5 for k in got)  # fp32 threads
