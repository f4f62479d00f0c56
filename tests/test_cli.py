"""`dscore score` end to end in-process: inputs, output schema, summary, bad input, resume."""

from __future__ import annotations

import json
import math
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import COMMANDS, main
from distributed_scoring.cli.common import discovered
from distributed_scoring.config import RayOptions
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S

REQUIRED = [S.ID, S.TEXT, S.PLL, S.N_TOKENS, S.N_WORDS, S.STATUS, S.ERROR, S.MODEL, S.VARIANT]
SUMMARY_KEYS = {"rows", "ok", "errors", "sum_pll", "n_tokens", "n_words", "pppl_token", "pppl_word", "model", "variant"}


def score(capsys, *args) -> tuple[int, dict | None, str]:
    rc = main(["score", *map(str, args)])
    captured = capsys.readouterr()
    return rc, json.loads(captured.out) if rc == 0 else None, captured.err


def rows(out) -> dict[str, dict]:
    return {r[S.ID]: r for r in pq.read_table(out / "rows").to_pylist()}


@pytest.fixture
def corpus(tmp_path):
    long_line = " ".join(["the"] * 200)
    lines = [
        "The quick brown fox jumps.",
        "",
        "   ",
        "Naïve café ☃",
        "the",
        long_line,
        "Colourless green ideas sleep furiously.",
        "Colourless green ideas sleep furiously.",
    ]
    text = tmp_path / "corpus.txt"
    text.write_bytes(("\n".join(lines) + "\n").encode() + b"caf\xe9 latin-1\n")
    return text


def test_text_file_edge_cases_schema_and_summary(corpus, tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    rc, summary, _ = score(
        capsys,
        corpus,
        "--model",
        tiny_model_dir("bert"),
        "--output",
        out,
        "--per-token",
        "--word-scores",
        "--shard-rows",
        "3",
    )
    assert rc == 0
    table = pq.read_table(out / "rows")
    assert table.num_rows == 9 and set(REQUIRED) <= set(table.column_names)
    assert {S.TOKENS, S.TOKEN_LOGPROBS, S.WORD_SCORES} <= set(table.column_names)
    r = rows(out)
    assert sorted(r) == sorted(f"corpus.txt:{i}" for i in range(1, 10))
    status = {k: v[S.STATUS] for k, v in r.items()}
    assert [status[f"corpus.txt:{i}"] for i in range(1, 10)] == [
        "ok",
        "error",
        "error",
        "ok",
        "ok",
        "ok",  # 200 tokens: scored in windows of the tiny model's 96
        "ok",
        "ok",
        "error",
    ]
    assert "empty" in r["corpus.txt:2"][S.ERROR]
    assert r["corpus.txt:6"][S.WINDOWED] and r["corpus.txt:6"][S.N_TOKENS] == 200
    assert not any(v[S.WINDOWED] for k, v in r.items() if k != "corpus.txt:6")
    assert "UTF-8" in r["corpus.txt:9"][S.ERROR]
    one = r["corpus.txt:5"]
    assert one[S.N_TOKENS] == 1 and one[S.N_WORDS] == 1 and len(one[S.TOKENS]) == 1
    assert r["corpus.txt:7"][S.PLL] == r["corpus.txt:8"][S.PLL]  # duplicate lines, distinct ids
    for row in r.values():
        if row[S.STATUS] == "ok":
            assert row[S.PLL] == pytest.approx(sum(row[S.TOKEN_LOGPROBS]))
            assert row[S.PLL] == pytest.approx(sum(row[S.WORD_SCORES]))
            assert len(row[S.WORD_SCORES]) == row[S.N_WORDS] == len(row[S.TEXT].split())
            assert row[S.PPPL_TOKEN] == pytest.approx(math.exp(-row[S.PLL] / row[S.N_TOKENS]))
    assert SUMMARY_KEYS <= set(summary)
    assert summary == json.loads((out / "summary.json").read_text())
    assert (summary["rows"], summary["ok"], summary["errors"], summary["windowed_rows"]) == (9, 6, 3, 1)
    ok = [v for v in r.values() if v[S.STATUS] == "ok"]
    assert summary["sum_pll"] == pytest.approx(sum(v[S.PLL] for v in ok))
    assert summary["pppl_token"] == pytest.approx(math.exp(-summary["sum_pll"] / sum(v[S.N_TOKENS] for v in ok)))
    assert summary["pppl_word"] == pytest.approx(math.exp(-summary["sum_pll"] / sum(v[S.N_WORDS] for v in ok)))


def test_jsonl_and_parquet_with_id_columns(tmp_path, tiny_model_dir, capsys):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        '{"key": "j1", "sentence": "Hello world"}\n\n{"key": "j2", "sentence": 7}\n'
        '{"sentence": "no key"}\n{"key": "j3", "sentence": "Fine again"}\n'
    )
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.table({"key": [10, 11], "sentence": ["Parquet row one", None]}), parquet)
    out = tmp_path / "out"
    rc, summary, _ = score(
        capsys,
        jsonl,
        parquet,
        "--model",
        tiny_model_dir("roberta"),
        "--output",
        out,
        "--text-column",
        "sentence",
        "--id-column",
        "key",
        "--variant",
        "word_l2r",
    )
    assert rc == 0
    r = rows(out)
    assert sorted(r) == ["10", "11", "a.jsonl:2", "a.jsonl:4", "j1", "j2", "j3"]
    assert [r[k][S.STATUS] for k in ["j1", "j3", "10"]] == ["ok"] * 3
    assert "empty line" in r["a.jsonl:2"][S.ERROR]
    assert "not a string" in r["j2"][S.ERROR]
    assert "'key'" in r["a.jsonl:4"][S.ERROR]
    assert "null" in r["11"][S.ERROR]
    assert {v[S.VARIANT] for v in r.values()} == {"word_l2r"}
    assert summary["rows"] == 7 and summary["ok"] == 3


def test_batching_does_not_change_results(corpus, tmp_path, tiny_model_dir, capsys):
    model = tiny_model_dir("albert")
    assert score(capsys, corpus, "--model", model, "--output", tmp_path / "a", "--batch-tokens", "16")[0] == 0
    assert score(capsys, corpus, "--model", model, "--output", tmp_path / "b", "--shard-rows", "2")[0] == 0
    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert a.keys() == b.keys()
    for key in a:
        if a[key][S.STATUS] == "ok":
            assert a[key][S.PLL] == pytest.approx(b[key][S.PLL], abs=1e-5)


def test_clear_errors(corpus, tmp_path, tiny_model_dir, capsys):
    model = tiny_model_dir("bert")
    rc, _, err = score(capsys, tmp_path / "missing.txt", "--model", model, "--output", tmp_path / "o1")
    assert rc == 2 and "missing.txt" in err and "does not exist" in err
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"text": "a b"}\n')
    rc, _, err = score(capsys, jsonl, "--model", model, "--output", tmp_path / "o2", "--text-column", "sentence")
    assert rc == 2 and "'sentence'" in err and "'text'" in err
    parquet = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": ["a"]}), parquet)
    rc, _, err = score(capsys, parquet, "--model", model, "--output", tmp_path / "o3", "--id-column", "uid")
    assert rc == 2 and "no id column 'uid'" in err
    rc, _, err = score(capsys, corpus, "--model", tmp_path / "no-model", "--output", tmp_path / "o4")
    assert rc == 2 and "does not exist" in err
    rc, _, err = score(capsys, corpus, "--model", corpus, "--output", tmp_path / "o5")
    assert rc == 2 and "is a file; a model is a folder" in err and "Traceback" not in err


def test_rerun_resumes_and_refuses_a_different_run(corpus, tmp_path, tiny_model_dir, capsys):
    model, out = tiny_model_dir("bert"), tmp_path / "out"
    args = (corpus, "--model", model, "--output", out, "--shard-rows", "4")
    assert score(capsys, *args)[0] == 0
    parts = sorted((out / "rows").glob("*.parquet"))
    assert len(parts) == 3
    first = {p.name: p.stat().st_mtime_ns for p in parts}
    # Simulate a crash that lost the last shard: only it is scored again.
    (out / "_done" / f"{parts[-1].name.removeprefix('part-').removesuffix('.parquet')}.json").unlink()
    parts[-1].unlink()
    rc, summary, _ = score(capsys, *args)
    assert rc == 0 and summary["rows"] == 9
    again = {p.name: p.stat().st_mtime_ns for p in sorted((out / "rows").glob("*.parquet"))}
    assert again.keys() == first.keys()
    assert [again[n] == first[n] for n in sorted(first)] == [True, True, False]
    rc, _, err = score(capsys, *args, "--variant", "word_l2r")
    assert rc == 2 and "different run" in err and "variant" in err
    assert score(capsys, *args, "--variant", "word_l2r", "--overwrite")[0] == 0
    assert {r[S.VARIANT] for r in rows(out).values()} == {"word_l2r"}


def test_partition_column_and_partition_by_file(tmp_path, tiny_model_dir, capsys):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        '{"text": "Hello world", "source": "news"}\n{"text": "", "source": "web"}\n'
        '{"text": "Good morning", "source": "web"}\n{"text": "No source here"}\n'
    )
    model = tiny_model_dir("bert")
    rc, summary, _ = score(capsys, jsonl, "--model", model, "--output", tmp_path / "a", "--partition-column", "source")
    assert rc == 0
    r = rows(tmp_path / "a")
    assert [r[f"p.jsonl:{i}"][S.PARTITION] for i in range(1, 5)] == ["news", "web", "web", None]
    assert {k: (v["rows"], v["ok"]) for k, v in summary["by_partition"].items()} == {
        "news": (1, 1),
        "web": (2, 1),
        "None": (1, 1),
    }
    text = tmp_path / "t.txt"
    text.write_text("one line\ntwo lines\n")
    rc, summary, _ = score(capsys, text, jsonl, "--model", model, "--output", tmp_path / "b", "--partition-by-file")
    assert rc == 0 and set(summary["by_partition"]) == {"t.txt", "p.jsonl"}
    assert {v[S.PARTITION] for v in rows(tmp_path / "b").values()} == {"t.txt", "p.jsonl"}
    rc, _, err = score(capsys, text, "--model", model, "--output", tmp_path / "c", "--partition-column", "source")
    assert rc == 2 and "--partition-by-file" in err


def _read_only_parent(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def _file_parent(tmp_path):
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file"


@pytest.mark.parametrize("parent", [_read_only_parent, _file_parent])
def test_an_output_folder_that_cannot_be_written_is_one_line(corpus, tmp_path, tiny_model_dir, capsys, parent):
    """It used to end in a PermissionError / NotADirectoryError traceback from pyarrow."""
    import os

    if parent is _read_only_parent and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    model, output = tiny_model_dir("bert"), parent(tmp_path) / "out"
    capsys.readouterr()
    rc, _, err = score(capsys, corpus, "--model", model, "--output", output)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(output) in err and "--output you can write to" in err


def test_unknown_tokens_are_counted_and_a_mostly_unknown_corpus_warns(tmp_path, tiny_model_dir, capsys, caplog):
    """A protein without spaces is one [UNK] and symbols outside the vocabulary are [UNK]s: both used to
    score as `ok` with nothing to tell them from readable text."""
    text = tmp_path / "mixed.txt"
    text.write_text("EVQLVESGGGLVQ\n☃ ☃☃ ☃\nthe quick brown fox\nthe lazy dog\n")
    rc, summary, _ = score(capsys, text, "--model", tiny_model_dir("bert"), "--output", tmp_path / "out")
    assert rc == 0
    table = pq.read_table(tmp_path / "out" / "rows")
    assert table.schema.field(S.N_UNKNOWN).type == pa.int32()
    by_text = {r[S.TEXT]: r for r in table.to_pylist()}
    assert by_text["EVQLVESGGGLVQ"][S.N_UNKNOWN] == by_text["EVQLVESGGGLVQ"][S.N_TOKENS] == 1
    assert by_text["☃ ☃☃ ☃"][S.N_UNKNOWN] == by_text["☃ ☃☃ ☃"][S.N_TOKENS] == 3
    assert by_text["the lazy dog"][S.N_UNKNOWN] == 0 and by_text["the lazy dog"][S.STATUS] == S.STATUS_OK
    assert summary["n_unknown"] == 4 and summary["mostly_unknown_rows"] == 2
    [warning] = summary["warnings"]
    assert "2 of 4 scored rows" in warning and "--split-chars" in warning
    assert warning in caplog.text
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["warnings"] == summary["warnings"]


def test_a_readable_corpus_has_no_unknown_warning(corpus, tmp_path, tiny_model_dir, capsys):
    rc, summary, _ = score(capsys, corpus, "--model", tiny_model_dir("bert"), "--output", tmp_path / "out")
    assert rc == 0 and summary["warnings"] == [] and summary["mostly_unknown_rows"] <= 1


def test_split_chars_scores_one_token_per_residue_and_enters_the_fingerprint(tmp_path, tiny_model_dir, capsys):
    text = tmp_path / "protein.txt"
    text.write_text("EVQL\n")
    model, out = tiny_model_dir("bert"), tmp_path / "out"
    rc, summary, _ = score(
        capsys, text, "--model", model, "--output", out, "--split-chars", "--per-token", "--word-scores"
    )
    assert rc == 0 and summary["n_unknown"] == 0 and summary["warnings"] == []
    [row] = pq.read_table(out / "rows").to_pylist()
    assert row[S.TEXT] == "EVQL" and row[S.TOKENS] == ["e", "v", "q", "l"]
    assert row[S.N_TOKENS] == row[S.N_WORDS] == len(row[S.WORD_SCORES]) == 4 and row[S.N_UNKNOWN] == 0
    rc, _, err = score(capsys, text, "--model", model, "--output", out, "--per-token", "--word-scores")
    assert rc == 2 and "split_chars" in err  # a resume without the option would mix tokenisations


def test_joints_has_no_variant_flag(tmp_path, capsys):
    """The joints' conditionals mask exactly the pair; a PLL masking variant would be silently ignored."""
    with pytest.raises(SystemExit) as exit_:
        main(["joints", "corpus.txt", "--model", "m", "--output", str(tmp_path), "--variant", "word_l2r"])
    assert exit_.value.code == 2 and "--variant" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, verbose",
    [
        (["score", "c.txt", "--model", "m", "--output", "o", "--ray"], False),
        (["--verbose", "score", "c.txt", "--model", "m", "--output", "o", "--ray"], True),
        (["score", "c.txt", "--model", "m", "--output", "o", "--ray", "--verbose"], True),
        (["--verbose", "score", "c.txt", "--model", "m", "--output", "o", "--address", "auto"], True),
    ],
)
def test_verbose_shows_ray_on_the_terminal_before_or_after_the_command(monkeypatch, capsys, argv, verbose):
    from distributed_scoring.workflows import score as score_workflow

    seen = []
    monkeypatch.setattr(score_workflow, "score", lambda config, ray, overwrite: seen.append(ray) or {})
    assert main(argv) == 0
    assert seen[0].verbose is verbose


def test_audit_scores_in_process_without_ray_and_on_ray_with_it(corpus, tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`--ray` used to be accepted and ignored (an audit always ran on Ray); now it means what it means for
    `dscore score`. Here the run in this process is real, the one on Ray only asked for."""
    from distributed_scoring.workflows.audit import run

    seen, real = [], run.score
    monkeypatch.setattr(
        run, "score", lambda config, ray, overwrite, **held: seen.append(ray) or real(config, ray, overwrite, **held)
    )
    common = [str(corpus), "--model", str(tiny_model_dir("bert"))]
    assert main(["audit", *common, "--output", str(tmp_path / "local")]) == 0
    assert seen == [None] and json.loads(capsys.readouterr().out)["rows"] == 9
    assert (tmp_path / "local" / "report.html").exists()

    def asked(config, ray, overwrite, **held):
        seen.append(ray)
        raise UserError("stopped before scoring")

    monkeypatch.setattr(run, "score", asked)
    assert main(["audit", *common, "--output", str(tmp_path / "ray"), "--ray", "--num-actors", "2"]) == 2
    assert seen[1] == RayOptions(num_actors=2)


def test_device_takes_one_gpu_by_number_and_refuses_other_names(capsys):
    from distributed_scoring.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["score", "x.txt", "--model", "m", "--output", "o", "--device", "cuda:1"]).device == "cuda:1"
    assert parse(["score", "x.txt", "--model", "m", "--output", "o"]).device == "auto"
    for bad in ("gpu", "cuda:", "cuda:x"):
        with pytest.raises(SystemExit) as exit_:
            parse(["score", "x.txt", "--model", "m", "--output", "o", "--device", bad])
        assert exit_.value.code == 2 and "or cuda:N" in capsys.readouterr().err


def test_a_command_is_its_own_module_found_by_the_registry(tmp_path, monkeypatch):
    """`cli.common.discovered` gathers every module of a package that declares `COMMAND`, in `place` order, with
    its module filled in; a module without one (shared flags) and `__main__` are left out."""

    package = tmp_path / "made_up_cli"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("raise SystemExit('never imported')\n")
    (package / "shared.py").write_text("FLAGS = ()\n")
    for name, place in (("later", 20), ("first", 10)):
        (package / f"{name}.py").write_text(
            "from distributed_scoring.cli.common import Command\n"
            f"COMMAND = Command({name!r}, 'the {name} command', place={place})\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    import made_up_cli

    try:
        found = discovered(made_up_cli)
        assert [(c.name, c.module.__name__) for c in found] == [
            ("first", "made_up_cli.first"),
            ("later", "made_up_cli.later"),
        ]
    finally:
        for name in [m for m in sys.modules if m.startswith("made_up_cli")]:
            del sys.modules[name]
    assert [c.place for c in COMMANDS] == sorted(c.place for c in COMMANDS)
    assert {c.name for c in COMMANDS} >= {"score", "variants", "job", "train", "verify"}


def test_a_run_says_how_many_rows_it_windowed_and_long_texts_error_names_the_way_out(
    corpus, tmp_path, tiny_model_dir, capsys, caplog
):
    model = tiny_model_dir("bert")
    with caplog.at_level("INFO", logger="distributed_scoring"):
        assert score(capsys, corpus, "--model", model, "--output", tmp_path / "window")[0] == 0
    said = [r.getMessage() for r in caplog.records if "scored in windows" in r.getMessage()]
    assert said == [
        "1 of 6 scored rows was longer than the model's maximum and scored in windows (--long-texts window): a text "
        "of n tokens costs n masked copies of the model's full width instead of n + 2 tokens, so such rows cost "
        'more per token than the others (summary.json: windowed_rows; docs/score.md, "Long texts")'
    ]
    caplog.clear()
    out = tmp_path / "error"
    with caplog.at_level("INFO", logger="distributed_scoring"):
        assert score(capsys, corpus, "--model", model, "--output", out, "--long-texts", "error")[0] == 0
    assert not [r for r in caplog.records if "scored in windows" in r.getMessage()]
    error = rows(out)["corpus.txt:6"][S.ERROR]
    assert "over the model's maximum of 96" in error and "with --long-texts window" in error, error
