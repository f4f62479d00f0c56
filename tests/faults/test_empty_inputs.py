"""An empty input file through the commands that read a corpus (found by the adversarial trial, cases B58
and B64: tests/helpers/trial/bad_inputs.py).

`score` of an empty file is a finished run of 0 rows (exit 0), and so is `infill` now: it used to write a
0-row run and then fail reading its rows ("holds no finished shard: rerun the command", which no rerun
fixes). `audit` has nothing to audit: it is refused before any work, in one line, leaving no folder.
"""

from __future__ import annotations

import json

from distributed_scoring.cli import main


def test_infill_of_an_empty_file_is_a_finished_run_of_no_rows(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "out"
    code = main(["infill", str(tmp_path / "empty.jsonl"), "--model", str(tiny_model_dir("bert")), "--output", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["rows"] == summary["ok"] == summary["errors"] == 0
    assert json.loads((out / "summary.json").read_text())["rows"] == 0
    assert main(["verify", str(out)]) == 0 and capsys.readouterr().out.startswith("OK")


def test_audit_of_an_empty_file_is_refused_in_one_line_before_any_work(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "out"
    code = main(["audit", str(tmp_path / "empty.jsonl"), "--model", str(tiny_model_dir("bert")), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("dscore: error: ") and "no rows to audit" in err[-1]
    assert "Traceback" not in "\n".join(err) and not out.exists()
