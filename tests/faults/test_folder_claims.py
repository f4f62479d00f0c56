"""Every command claims its output folder before its first byte, so nothing of two runs is mixed and
nothing of the user's is lost.

1. a second rescore into a folder held by a first changes no byte of it, and rescoring refuses scores
   whose text is not the hypothesis they are assigned to;
2. an --output equal to or inside an input (or an input inside the --output) is refused;
3. a non-empty folder that holds no run (the user's own files) is refused, and so is --output '';
4. an unmarked Parquet file in rows/ (a copied shard) is read by no reader, each warns;
5. --overwrite deletes exactly what the run layer wrote: user files in rows/ and _done/ survive, a
   previous audit's reports do not.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.io import schema as S
from distributed_scoring.io.lock import current_pid_namespace

from helpers import rescoring as H
from helpers import tiny

SHARD_ROWS = 4


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path -> SHA-256 of its bytes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def hold(folder: Path) -> None:
    """The lock a live run on another machine holds on `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (folder / "_lock.json").write_text(
        json.dumps(
            {
                "host": "gpu-node-7",
                "pid": 4242,
                "pid_namespace": current_pid_namespace(),
                "started": now - 60,
                "heartbeat": now,
                "token": "run-a",
            }
        )
    )


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dscore: "), err
    return err[0]


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "data" / "corpus.txt"
    path.parent.mkdir()
    path.write_text("\n".join(tiny.CORPUS) + "\n")
    return path


@pytest.fixture
def bert(tiny_model_dir) -> str:
    return str(tiny_model_dir("bert"))


def score(capsys, *args) -> int:
    code = main(["score", *map(str, args), "--shard-rows", str(SHARD_ROWS)])
    return code


# 1. Two rescoring runs into one folder.


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def nbest(tmp_path) -> dict[str, str]:
    lists = {}
    for run, seed in (("a", 1), ("b", 5)):
        for split, offset in (("dev", 0), ("test", 1)):
            records, _ = H.synthetic_nbest(3, 3, seed=seed + offset, prefix=f"{run}{split}")
            lists[f"{run}_{split}"] = write_jsonl(tmp_path / f"{run}_{split}.jsonl", records)
    return lists


def rescore(nbest: dict[str, str], run: str, output: Path, model: str) -> int:
    return main(
        [
            "rescore",
            "--dev",
            nbest[f"{run}_dev"],
            "--test",
            nbest[f"{run}_test"],
            "--model",
            model,
            "--output",
            str(output),
            "--shard-rows",
            "5",
        ]
    )


def test_a_second_rescore_into_a_held_folder_changes_no_byte(tmp_path, nbest, bert, capsys):
    """Item 1: run B used to replace R/texts/texts.parquet before it took a lock (which covered R/mlm
    only); run A, still scoring, then read B's texts for its remaining shards."""
    out = tmp_path / "R"
    assert rescore(nbest, "a", out, bert) == 0
    capsys.readouterr()
    hold(out)  # run A holds the folder (and, as before this fix, its mlm sub-run)
    hold(out / "mlm")
    before = snapshot(out)
    assert rescore(nbest, "b", out, bert) == 2
    assert "in use by another run: pid 4242 on gpu-node-7" in one_error_line(capsys)
    assert snapshot(out) == before


def test_a_second_rescore_into_a_new_held_folder_writes_nothing(tmp_path, nbest, bert, capsys):
    out = tmp_path / "R"
    hold(out)
    assert rescore(nbest, "b", out, bert) == 2
    one_error_line(capsys)
    assert [p.name for p in out.rglob("*")] == ["_lock.json"]


def test_rescoring_refuses_scores_whose_text_is_not_the_hypothesis(tmp_path, nbest, bert, capsys):
    """Item 1's mixing, made deterministic: a shard of R/mlm holds scores of another run's texts (what
    run A wrote after run B had replaced the texts it was reading). They used to be assigned to A's
    hypotheses by position, exit 0."""
    out = tmp_path / "R"
    assert rescore(nbest, "a", out, bert) == 0
    capsys.readouterr()
    part = sorted((out / "mlm" / "rows").glob("part-*.parquet"))[-1]
    table = pq.read_table(part)
    texts = table.column(S.TEXT).to_pylist()
    texts[0] = "a text of another run"
    pq.write_table(table.set_column(table.schema.get_field_index(S.TEXT), S.TEXT, pa.array(texts)), part)
    assert rescore(nbest, "a", out, bert) in (1, 2)
    line = one_error_line(capsys)
    assert "a text of another run" in line and "mlm" in line


# 2. The output folder is an input.


def test_an_output_equal_to_an_input_is_refused(tmp_path, corpus, bert, capsys):
    """`dscore score o/x --output o/x`: the run read its own rows/ and summary.json back as input, wrote
    twice the rows, then crashed with a traceback; with --overwrite too."""
    out = tmp_path / "o" / "x"
    assert score(capsys, corpus, "--model", bert, "--output", out) == 0
    capsys.readouterr()
    before = snapshot(out)
    for overwrite in ((), ("--overwrite",)):
        assert score(capsys, out, "--model", bert, "--output", out, *overwrite) == 2
        line = one_error_line(capsys)
        assert f"--output {out}" in line and "input" in line
        assert snapshot(out) == before


def test_an_output_inside_an_input_folder_and_an_input_inside_the_output_are_refused(tmp_path, corpus, bert, capsys):
    assert score(capsys, corpus.parent, "--model", bert, "--output", corpus.parent / "scores") == 2
    assert "inside the input" in one_error_line(capsys)
    assert not (corpus.parent / "scores").exists()
    out = tmp_path / "o"
    assert score(capsys, corpus, "--model", bert, "--output", out) == 0
    capsys.readouterr()
    before = snapshot(out)
    part = sorted((out / "rows").glob("part-*.parquet"))[0]
    assert score(capsys, part, "--text-column", S.TEXT, "--model", bert, "--output", out, "--overwrite") == 2
    assert "inside --output" in one_error_line(capsys)
    assert snapshot(out) == before


# 3. Folders that hold no run.


def test_audit_refuses_a_folder_of_the_users_own_files(tmp_path, corpus, bert, capsys):
    """Item 4: `dscore audit` overwrote a user's summary.json, report.html and audit.json, exit 0."""
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("summary.json", "report.html", "audit.json"):
        (out / name).write_text(f"the user's own {name}")
    before = snapshot(out)
    for overwrite in ((), ("--overwrite",)):
        assert main(["audit", str(corpus), "--model", bert, "--output", str(out), *overwrite]) == 2
        assert "holds no _run.json" in one_error_line(capsys)
        assert snapshot(out) == before


@pytest.mark.parametrize("command", ["score", "audit"])
def test_an_empty_output_is_refused(tmp_path, corpus, bert, capsys, monkeypatch, command):
    """`--output ''` wrote a run into the current directory."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main([command, str(corpus), "--model", bert, "--output", ""]) == 2
    assert "--output is empty" in one_error_line(capsys)
    assert snapshot(tmp_path) == before


# 4. A stray file in rows/.


def test_a_copied_shard_is_read_by_no_reader(tmp_path, corpus, bert, capsys, caplog):
    """Item 6: a copy of a shard under another name in rows/ was counted by the audit (and every report
    that read rows/ as a dataset): 18 rows of a corpus of 14, 4 ids twice."""
    out = tmp_path / "audit"
    args = ["audit", str(corpus), "--model", bert, "--output", str(out), "--shard-rows", str(SHARD_ROWS)]
    assert main(args) == 0
    capsys.readouterr()
    shutil.copy(sorted((out / "rows").glob("part-*.parquet"))[0], out / "rows" / "part-copy.parquet")
    (out / "summary.json").unlink()  # the rerun summarises and audits again
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == len(tiny.CORPUS)
    assert json.loads((out / "summary.json").read_text())["rows"] == len(tiny.CORPUS)
    assert json.loads((out / "audit.json").read_text())["overall"]["rows"] == len(tiny.CORPUS)
    assert pq.read_metadata(out / "row_stats.parquet").num_rows == len(tiny.CORPUS)
    assert "rows/part-copy.parquet" in caplog.text and "no completion marker" in caplog.text
    assert (out / "rows" / "part-copy.parquet").exists()  # not ours to delete
    assert main(["verify", str(out)]) == 1
    assert "part-copy.parquet" in capsys.readouterr().out


# 5. What --overwrite deletes.


def test_overwrite_keeps_user_files_and_drops_a_previous_audits_reports(tmp_path, corpus, bert, capsys):
    """Item 7: --overwrite deleted rows/ and _done/ whole (the user's files in them too) and left a
    previous audit's audit.json and report.html beside the new score run's results."""
    out = tmp_path / "out"
    assert main(["audit", str(corpus), "--model", bert, "--output", str(out), "--shard-rows", str(SHARD_ROWS)]) == 0
    capsys.readouterr()
    mine = {out / "rows" / "notes.txt": "mine", out / "_done" / "README": "mine too", out / "my-notes.txt": "and this"}
    for path, text in mine.items():
        path.write_text(text)
    assert score(capsys, corpus, "--model", bert, "--output", out, "--overwrite") == 0
    for path, text in mine.items():
        assert path.read_text() == text
    for derived in ("audit.json", "report.html", "row_stats.parquet", "outliers.parquet"):
        assert not (out / derived).exists(), derived
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == len(tiny.CORPUS)
    assert len(list((out / "_done").glob("*.json"))) == len(list((out / "rows").glob("part-*.parquet"))) == 4


def test_verify_of_a_rescore_folder_verifies_its_sub_runs(tmp_path, nbest, bert, capsys):
    """verify of a `dscore rescore` folder used to say "not a run folder" (exit 2)."""
    out = tmp_path / "R"
    assert rescore(nbest, "a", out, bert) == 0
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"OK: {out}") and any(f"{out}/mlm" in line for line in lines), lines
    (out / "mlm" / "summary.json").unlink()
    assert main(["verify", str(out)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"INCOMPLETE: {out}")
