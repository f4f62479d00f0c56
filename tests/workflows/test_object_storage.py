"""Every command's object-storage path on a real S3 API (moto's server on loopback, `AWS_ENDPOINT_URL`):
`score` from every input kind to s3 equals a local run, joined by id; a rerun resumes, `--overwrite` replaces,
another run is refused; a run killed with `kill -9` resumes; `verify` says OK; `audit` against an s3 baseline
regresses as a local one does; `rescore` from and to s3 equals a local one; `train` into s3 is refused; a
`datasets` folder on s3 is read from s3; `--ray` from s3 to s3; the requests a shard costs; the URIs refused.
"""

from __future__ import annotations

import gzip
import json
import logging
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main

from helpers import rescoring as H
from helpers import tiny
from helpers.cli import refusal
from helpers.driver import embedded_env, make_corpus, why

LINES = [tiny.CORPUS[i % len(tiny.CORPUS)] + f" {i}" for i in range(7)]
# Figures of summary.json that count, and those that sum PLLs (equal within the PLL's tolerance).
COUNTS = ("rows", "ok", "errors", "rows_expected", "n_tokens", "n_words", "n_unknown", "shards")
SUMS = ("sum_pll", "pppl_token", "pppl_word")


def inputs(folder: Path) -> dict[str, Path]:
    """The same rows as text, gzip'd text, JSONL and Parquet (ids from a column where the format has one)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.txt").write_text("".join(f"{line}\n" for line in LINES))
    (folder / "c.txt.gz").write_bytes(gzip.compress((folder / "c.txt").read_bytes()))
    (folder / "c.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(LINES)))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(LINES))], "text": LINES}), folder / "c.parquet")
    return {p.name: p for p in folder.iterdir()}


def rows_by_id(rows: str | Path) -> dict[str, dict]:
    """A run's rows (a local folder or an s3 URI) keyed by id, each id once."""
    table = pq.read_table(rows)
    ids = Counter(table.column("id").to_pylist())
    assert set(ids.values()) == {1}, f"ids written more than once: {[k for k, n in ids.items() if n > 1][:5]}"
    return {row["id"]: row for row in table.to_pylist()}


def assert_same_rows(got: dict[str, dict], expected: dict[str, dict], tolerance: float = 1e-6) -> None:
    assert got.keys() == expected.keys()
    for key, row in got.items():
        assert row["text"] == expected[key]["text"] and row["status"] == expected[key]["status"], key
        assert abs(row["pll"] - expected[key]["pll"]) < tolerance, (key, row["pll"], expected[key]["pll"])


def assert_same_figures(got: dict, expected: dict, tolerance: float = 1e-6) -> None:
    """summary.json's counts equal, its sums of PLLs within `tolerance` (relative for the PPPLs)."""
    assert {k: got[k] for k in COUNTS} == {k: expected[k] for k in COUNTS}
    close = [abs(got[k] - expected[k]) < tolerance * max(1.0, abs(expected[k])) for k in SUMS]
    assert all(close), {k: (got[k], expected[k]) for k in SUMS}


def score(source: str, model: str, output: str, *extra: str) -> int:
    ids = ["--id-column", "id"] if source.endswith((".jsonl", ".parquet")) else []
    return main(["score", source, "--model", model, "--output", output, "--shard-rows", "2", *ids, *extra])


def shards_written(requests: list[str], out: str) -> set[str]:
    """The shard files and markers under `out` that these requests (as moto logs them: "PUT /bucket/key HTTP/1.1")
    wrote."""
    keys = {r.split()[1].split("?")[0].split("/", 2)[-1] for r in requests if r.startswith("PUT ")}
    return {k for k in keys if k.startswith(f"{out}/rows/") or k.startswith(f"{out}/_done/") and k.endswith(".json")}


@pytest.mark.parametrize(
    "given, n_files",
    [
        ("c.txt", 1),
        ("c.txt.gz", 1),
        ("c.jsonl", 1),
        ("c.parquet", 1),
        pytest.param("", 4, id="folder"),  # the folder of all four: ids `in/c.jsonl:1` ...
        pytest.param("c.txt*", 2, id="glob"),  # c.txt and c.txt.gz
    ],
)
def test_each_input_kind_from_s3_to_s3_scores_like_a_local_run(given, n_files, s3, tiny_model_dir, tmp_path, capsys):
    model = str(tiny_model_dir("bert"))
    inputs(tmp_path / "in")
    local = str(tmp_path / "in" / given) if given else str(tmp_path / "in")
    assert score(local, model, str(tmp_path / "local")) == 0
    source = f"{s3.upload(tmp_path / 'in', 'in')}/{given}".rstrip("/")  # s3://bucket/in/<given>
    assert score(source, model, s3.uri("out")) == 0
    expected = rows_by_id(tmp_path / "local" / "rows")
    got = rows_by_id(s3.uri("out/rows/"))
    assert len(got) == n_files * len(LINES)
    assert_same_rows(got, expected)
    summary = json.loads(s3.get("out/summary.json"))
    assert_same_figures(summary, json.loads((tmp_path / "local" / "summary.json").read_text()))
    assert summary["rows"] == summary["ok"] == n_files * len(LINES)
    assert not [key for key in s3.keys("out/") if key.endswith((".tmp", "_lock.json", "/"))]


def test_a_rerun_resumes_another_run_is_refused_overwrite_replaces_and_verify_says_ok(
    s3, moto_server, tiny_model_dir, tmp_path, capsys, caplog
):
    caplog.set_level(logging.INFO, logger="distributed_scoring")
    model = str(tiny_model_dir("bert"))
    source = f"{s3.upload(inputs(tmp_path / 'in')['c.jsonl'], 'in')}/c.jsonl"
    assert score(source, model, s3.uri("out")) == 0
    first = json.loads(s3.get("out/summary.json"))
    rows = rows_by_id(s3.uri("out/rows/"))
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 0
    assert capsys.readouterr().out.startswith("OK")

    before = len(moto_server.requests())
    assert score(source, model, s3.uri("out")) == 0
    printed = capsys.readouterr().out
    assert "already complete: all 4 of its shards were scored before" in caplog.text
    rerun = moto_server.requests()[before:]
    assert not shards_written(rerun, "out"), "shards scored again"
    assert json.loads(printed) == json.loads(s3.get("out/summary.json")) == first
    assert_same_rows(rows_by_id(s3.uri("out/rows/")), rows)

    float64 = ["score", source, "--model", model, "--output", s3.uri("out"), "--id-column", "id",
               "--shard-rows", "2", "--dtype", "float64"]  # fmt: skip
    line = refusal(capsys, float64)
    assert "holds results of a different run" in line and "dtype" in line
    assert json.loads(s3.get("out/summary.json")) == first  # the refusal changed nothing

    assert main([*float64, "--overwrite"]) == 0
    replaced = json.loads(s3.get("out/summary.json"))
    assert replaced["signature"]["dtype"] == "float64" and first["signature"]["dtype"] != "float64"
    assert_same_rows(rows_by_id(s3.uri("out/rows/")), rows, tolerance=1e-3)  # float64 against float32
    assert {k: replaced[k] for k in COUNTS} == {k: first[k] for k in COUNTS}
    capsys.readouterr()
    assert main(["verify", s3.uri("out")]) == 0
    assert capsys.readouterr().out.startswith("OK")


def test_a_run_killed_while_writing_to_s3_resumes_with_each_id_once(s3, moto_server, tiny_model_dir, tmp_path):
    """`kill -9` of a `dscore score` process mid-run leaves its lock and some marked shards on s3; the rerun takes
    the lock over, scores only the shards left, and every input row is written once."""
    n = 60
    source = f"{s3.upload(Path(make_corpus(tmp_path / 'in', n)), 'in')}/many.txt"
    model = str(tiny_model_dir("bert"))
    args = ["score", source, "--model", model, "--output", s3.uri("out"), "--shard-rows", "1"]
    with (tmp_path / "driver.log").open("w") as log:
        driver = subprocess.Popen([sys.executable, "-m", "distributed_scoring.cli", *args], env=embedded_env(),
                                  stdout=log, stderr=log)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(s3.keys("out/_done/")) < 3 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()
    markers = [key for key in s3.keys("out/_done/") if key.endswith(".json")]
    assert 3 <= len(markers) < n, f"{len(markers)} of {n} shards done when the driver was killed"
    assert "out/_lock.json" in s3.keys("out/"), "a killed run leaves its lock"
    finished = {*markers, *(f"out/rows/part-{Path(key).stem}.parquet" for key in markers)}

    before = len(moto_server.requests())
    assert main(args) == 0  # (the killed driver's log: tmp_path / "driver.log")
    again = shards_written(moto_server.requests()[before:], "out")
    assert again and not again & finished, f"shards finished before the kill were written again: {again & finished}"
    ids = Counter(pq.read_table(s3.uri("out/rows/"), columns=["id"]).column("id").to_pylist())
    assert set(ids) == {f"many.txt:{i}" for i in range(1, n + 1)}, "rows lost or foreign ids"
    assert set(ids.values()) == {1}, f"ids written twice: {[k for k, v in ids.items() if v > 1][:5]}"
    summary = json.loads(s3.get("out/summary.json"))
    assert summary["rows"] == summary["rows_expected"] == n
    shards = [f"00000-{i:012d}" for i in range(n)]
    assert s3.keys("out/rows/") == [f"out/rows/part-{shard}.parquet" for shard in shards]
    assert [key for key in s3.keys("out/_done/") if key.endswith(".json")] == [f"out/_done/{s}.json" for s in shards]
    assert "out/_lock.json" not in s3.keys("out/")
    assert main(["verify", s3.uri("out")]) == 0


def test_an_audit_into_s3_against_an_s3_baseline_regresses_as_a_local_one_does(s3, tiny_model_dir, tmp_path, capsys):
    """The snapshot turned half its rows into error rows since the baseline: exit 3, locally and on s3 alike."""
    model = str(tiny_model_dir("bert"))
    day1, day2 = tmp_path / "day1" / "news.txt", tmp_path / "day2" / "news.txt"
    for path, lines in ((day1, tiny.CORPUS * 2), (day2, tiny.CORPUS * 2 + [""] * len(tiny.CORPUS) * 2)):
        path.parent.mkdir()
        path.write_text("\n".join(lines) + "\n")
    results = {}
    for where, folder in (("local", str(tmp_path)), ("s3", s3.uri().rstrip("/"))):
        assert main(["audit", str(day1), "--model", model, "--output", f"{folder}/audit1"]) == 0
        capsys.readouterr()
        args = ["audit", str(day2), "--model", model, "--output", f"{folder}/audit2"]
        code = main([*args, "--baseline", f"{folder}/audit1/audit.json"])
        printed = json.loads(capsys.readouterr().out)
        results[where] = code, {k: v for k, v in printed.items() if k != "report"}
    local_audit = json.loads((tmp_path / "audit2" / "audit.json").read_text())
    s3_audit = json.loads(s3.get("audit2/audit.json"))
    assert results["s3"] == results["local"] and results["s3"][0] == 3
    assert results["s3"][1]["verdict"] == "regression"
    assert s3_audit["baseline"]["source"].startswith("s3://")
    for key in ("verdict", "exit_code", "regressed", "insufficient"):
        assert s3_audit["baseline"][key] == local_audit["baseline"][key], key
    assert s3_audit["baseline"]["overall"]["status"] == "regression"
    for key in ("rows", "ok", "errors", "n_tokens", "error_rate"):
        assert s3_audit["overall"][key] == local_audit["overall"][key], key
    assert abs(s3_audit["overall"]["pppl_token"] - local_audit["overall"]["pppl_token"]) < 1e-6
    assert {"audit2/audit.json", "audit2/row_stats.parquet", "audit2/report.html"} <= set(s3.keys("audit2/"))
    capsys.readouterr()
    assert main(["verify", s3.uri("audit2")]) == 0


def test_rescoring_nbest_lists_on_s3_into_s3_equals_a_local_rescoring(s3, tiny_model_dir, tmp_path, capsys):
    model = str(tiny_model_dir("bert"))
    folder = tmp_path / "nbest"
    folder.mkdir()
    for split, seed in (("dev", 1), ("test", 2)):
        records, _ = H.synthetic_nbest(4, 3, seed=seed, prefix=split[0])
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    remote = s3.upload(folder, "nbest")
    for where, lists, out in (("local", str(folder), str(tmp_path / "out")), ("s3", remote, s3.uri("out"))):
        args = ["rescore", "--dev", f"{lists}/dev.jsonl", "--test", f"{lists}/test.jsonl", "--model", model]
        assert main([*args, "--output", out, "--shard-rows", "5"]) == 0, where
    capsys.readouterr()
    local_report = json.loads((tmp_path / "out" / "report.json").read_text())
    report = json.loads(s3.get("out/report.json"))
    for key in ("lambda", "gamma", "mlm_alpha", "dev", "test", "lms"):
        assert report[key] == local_report[key], key
    key = ("split", "utt_id", "hyp_id")
    local = {tuple(r[k] for k in key): r for r in pq.read_table(tmp_path / "out" / "hypotheses.parquet").to_pylist()}
    got = {tuple(r[k] for k in key): r for r in pq.read_table(s3.uri("out/hypotheses.parquet")).to_pylist()}
    assert got.keys() == local.keys() and len(got) == report["dev"]["hypotheses"] + report["test"]["hypotheses"]
    assert all(abs(got[k]["pll"] - local[k]["pll"]) < 1e-6 and got[k]["best"] == local[k]["best"] for k in got)
    assert s3.get("out/test.best.txt").decode() == (tmp_path / "out" / "test.best.txt").read_text()
    assert main(["verify", s3.uri("out")]) == 0
    assert capsys.readouterr().out.startswith("OK")


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
    exit 0 with its 3 rows instead of the 6 on s3)."""
    from datasets import Dataset

    texts = [f"{tiny.CORPUS[i % len(tiny.CORPUS)]} {i}" for i in range(6)]
    Dataset.from_dict({"text": texts}).save_to_disk(tmp_path / "hfds")
    source = s3.upload(tmp_path / "hfds", "nightly/hfds")
    monkeypatch.chdir(tmp_path)
    Dataset.from_dict({"text": ["a decoy", "on local", "disk"]}).save_to_disk(tmp_path / s3.name / "nightly" / "hfds")
    assert main(["score", source, "--model", str(tiny_model_dir("bert")), "--output", s3.uri("out")]) == 0
    rows = pq.read_table(s3.uri("out/rows/"))
    assert sorted(rows.column("text").to_pylist()) == sorted(texts)
    assert set(rows.column("status").to_pylist()) == {"ok"}


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
    model = str(tiny_model_dir("bert"))
    line = refusal(capsys, ["train", "pmlm", "--data", str(corpus), "--model", model, "--output", s3.uri("trained")])
    assert "not an object store" in line and s3.uri("trained") in line
    assert not s3.keys("trained")


@pytest.mark.ray
def test_a_run_on_ray_from_s3_to_s3_gives_the_in_process_rows(s3, tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("bert"))
    source = f"{s3.upload(inputs(tmp_path / 'in')['c.jsonl'], 'in')}/c.jsonl"
    assert score(source, model, s3.uri("local")) == 0
    dscore = str(Path(sys.executable).with_name("dscore"))
    argv = [dscore, "score", source, "--model", model, "--output", s3.uri("ray"), "--shard-rows", "2"]
    done = subprocess.run([*argv, "--id-column", "id", "--ray"], capture_output=True, text=True, env=embedded_env())
    assert done.returncode == 0, why(done.stderr)
    got = rows_by_id(s3.uri("ray/rows/"))
    assert len(got) == len(LINES)
    assert_same_rows(got, rows_by_id(s3.uri("local/rows/")), tolerance=1e-5)  # fp32 sums on other threads
    assert_same_figures(json.loads(s3.get("ray/summary.json")), json.loads(s3.get("local/summary.json")), 1e-5)
