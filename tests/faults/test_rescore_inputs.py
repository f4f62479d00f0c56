"""`dscore rescore` refuses unusable N-best lists (empty ones, ranks below 1) before any scoring.

An empty --dev or --test used to score the other list, then end in a numpy ValueError traceback; both empty
ended in an error naming the internal `texts/texts.parquet`. A `hyp_id` of 0 or -1 was taken, though the
docs call it a rank from 1.
"""

from __future__ import annotations

import json

import pytest

from distributed_scoring.cli import main

from helpers import rescoring as H


def write_jsonl(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def one_line_refusal(capsys, args: list[str]) -> str:
    capsys.readouterr()  # (the fixture's progress bars when it builds the model)
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("dscore: error: ")
    return err


@pytest.mark.parametrize("empty", [("--dev",), ("--test",), ("--dev", "--test")])
def test_an_empty_nbest_list_is_refused_in_one_line_before_any_scoring(tmp_path, tiny_model_dir, capsys, empty):
    records, _ = H.synthetic_nbest(3, 2, seed=1, prefix="d")
    files = {
        "--dev": write_jsonl(tmp_path / "dev.jsonl", records),
        "--test": write_jsonl(tmp_path / "test.jsonl", records),
    }
    for flag in empty:
        files[flag] = str(tmp_path / f"empty{flag[1:]}.jsonl")
        (tmp_path / f"empty{flag[1:]}.jsonl").write_text("")
    out = tmp_path / "out"
    err = one_line_refusal(
        capsys,
        [
            "rescore",
            *[x for kv in files.items() for x in kv],
            "--model",
            str(tiny_model_dir("bert")),
            "--output",
            str(out),
        ],
    )
    for flag in ("--dev", "--test"):
        assert (f"{flag} {files[flag]}" in err) == (flag in empty)
    assert "no hypotheses" in err and "texts.parquet" not in err
    assert not out.exists()  # nothing scored, nothing written


@pytest.mark.parametrize("rank", [0, -1, 2**31])
def test_a_hyp_id_that_is_not_a_rank_from_1_is_refused(tmp_path, tiny_model_dir, capsys, rank):
    records, _ = H.synthetic_nbest(3, 2, seed=1, prefix="d")
    records[1]["hyp_id"] = rank
    path = write_jsonl(tmp_path / "n.jsonl", records)
    err = one_line_refusal(
        capsys,
        [
            "rescore",
            "--dev",
            path,
            "--test",
            path,
            "--model",
            str(tiny_model_dir("bert")),
            "--output",
            str(tmp_path / "out"),
        ],
    )
    assert f"`hyp_id` {rank} is not a rank: ranks count from 1" in err and "line 2" in err
