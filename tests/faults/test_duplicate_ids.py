"""Repeated ids are refused before any work, unless --allow-duplicate-ids says they are meant.

`score`, `audit`, `infill`, `sample` (and `generate`, `train pmlm`, `joints`' given pairs) used to take them:
exit 0 with repeated ids in the rows (also `1` and `"1"` in JSON Lines, Parquet ids [1, 2, 2]); only
`dscore verify` noticed afterwards. Now: exit 2, one line naming the first repeated ids and their lines,
nothing written. With --allow-duplicate-ids the rows carry `line` (where each was read) and are keyed by
id and line: rows in == rows out, `dscore verify` passes, the folder records the choice.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main

from helpers.cli import refusal

JSONL_RECORDS = [
    {"id": 1, "text": "the [MASK] fox"},
    {"id": "2", "text": "a [MASK] dog"},
    {"id": "1", "text": "the [MASK] cat"},
    {"id": 7, "text": "x [MASK]"},
    {"id": 7, "text": "y [MASK]"},
]
JSONL_REFUSAL = (
    "2 ids of --id-column 'id' repeat: '1' at in.jsonl line 1 and in.jsonl line 3; "
    "'7' at in.jsonl line 4 and in.jsonl line 5."
)
PARQUET_REFUSAL = "1 id of --id-column 'id' repeats: '2' at in.parquet row 2 and in.parquet row 3."


def write_inputs(folder: Path) -> dict[str, Path]:
    jsonl = folder / "in.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in JSONL_RECORDS))
    parquet = folder / "in.parquet"
    pq.write_table(
        pa.table({"id": [1, 2, 2, None], "text": ["the [MASK] fox", "a [MASK]", "b [MASK]", "c [MASK]"]}),
        parquet,
        row_group_size=2,
    )
    return {"jsonl": jsonl, "parquet": parquet}


@pytest.mark.parametrize("command", ["score", "audit", "infill", "sample", "generate", "score --method chain"])
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_repeated_ids_are_refused_before_any_work_naming_them_and_their_lines(
    tmp_path, tiny_model_dir, capsys, command, kind
):
    source = write_inputs(tmp_path)[kind]
    out = tmp_path / "out"
    line = refusal(
        capsys,
        [
            *command.split(),
            str(source),
            "--id-column",
            "id",
            "--model",
            str(tiny_model_dir("bert")),
            "--output",
            str(out),
        ],
    )
    assert (JSONL_REFUSAL if kind == "jsonl" else PARQUET_REFUSAL) in line
    assert "--allow-duplicate-ids" in line and not out.exists()


def test_train_pmlm_refuses_repeated_ids_in_its_data(tmp_path, capsys):
    source = write_inputs(tmp_path)["jsonl"]
    line = refusal(
        capsys,
        [
            "train",
            "pmlm",
            "--data",
            str(source),
            "--id-column",
            "id",
            "--model",
            "unused",
            "--output",
            str(tmp_path / "out"),
        ],
    )
    assert JSONL_REFUSAL in line and not (tmp_path / "out").exists()


def test_joints_refuses_given_pairs_whose_ids_repeat(tmp_path, tiny_model_dir, capsys):
    given = tmp_path / "pairs.jsonl"
    given.write_text(
        "".join(
            json.dumps({"id": i, "text": "the quick brown fox", "positions": [0, 1]}) + "\n" for i in ("a", "b", "a")
        )
    )
    line = refusal(
        capsys, ["joints", str(given), "--model", str(tiny_model_dir("bert")), "--output", str(tmp_path / "out")]
    )
    assert "1 id of the given pairs' `id` field repeats: 'a' at pairs.jsonl line 1 and pairs.jsonl line 3" in line


def test_allowed_repeated_ids_are_kept_keyed_by_id_and_line(tmp_path, tiny_model_dir, capsys):
    inputs = write_inputs(tmp_path)
    out = tmp_path / "out"
    args = [
        "score",
        str(inputs["jsonl"]),
        str(inputs["parquet"]),
        "--id-column",
        "id",
        "--allow-duplicate-ids",
        "--model",
        str(tiny_model_dir("bert")),
        "--output",
        str(out),
        "--shard-rows",
        "2",
    ]
    capsys.readouterr()
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = pq.read_table(out / "rows").to_pylist()
    assert summary["rows"] == len(rows) == 9  # rows in == rows out
    keys = Counter((r["id"], r["line"]) for r in rows)
    assert set(keys.values()) == {1} and Counter(r["id"] for r in rows)["1"] == 3  # 1, "1" and Parquet's 1
    assert {r["line"] for r in rows} == {f"in.jsonl:{i}" for i in range(1, 6)} | {
        f"in.parquet:{i}" for i in range(1, 5)
    }
    by_line = {r["line"]: r for r in rows}
    assert by_line["in.jsonl:3"]["text"] == "the [MASK] cat" and by_line["in.parquet:4"]["id"] == "in.parquet:4"
    assert json.loads((out / "_run.json").read_text())["allow_duplicate_ids"] is True
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0 and capsys.readouterr().out.startswith("OK:")
    assert main(args) == 0  # the same command resumes: nothing left to do, no row twice
    assert pq.read_table(out / "rows").num_rows == 9
    line = refusal(capsys, [a for a in args if a != "--allow-duplicate-ids"])  # the folder's ids still repeat
    assert "--allow-duplicate-ids" in line


def test_infill_and_sample_keep_every_row_of_a_repeated_id(tmp_path, tiny_model_dir, capsys):
    """With the flag, each row is filled or sampled on its own (also the null text beside a good row)."""
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"id": "a", "text": "the [MASK] fox"},
                {"id": "a", "text": None},
                {"id": "a", "text": "a [MASK] dog"},
            ]
        )
    )
    model = str(tiny_model_dir("bert"))
    for command, per_row in (("infill", 1), ("sample", 2 * 3)):
        out = tmp_path / command
        extra = ["--chains", "2", "--epochs", "3"] if command == "sample" else []
        capsys.readouterr()
        assert (
            main(
                [
                    command,
                    str(source),
                    "--id-column",
                    "id",
                    "--allow-duplicate-ids",
                    "--model",
                    model,
                    "--output",
                    str(out),
                    *extra,
                ]
            )
            == 0
        )
        rows = pq.read_table(out / "rows").to_pylist()
        assert Counter(r["line"] for r in rows) == {f"in.jsonl:{i}": per_row for i in (1, 2, 3)}
        assert {r["status"] for r in rows if r["line"] == "in.jsonl:2"} == {"error"}
        assert all(r["status"] == "ok" for r in rows if r["line"] != "in.jsonl:2")
        assert main(["verify", str(out)]) == 0


def test_the_refusal_names_what_a_naive_count_finds(tmp_path):
    """Random ids over a JSON Lines file and a Parquet file cut in several shards: the refusal counts the
    repeated ids as `Counter` does and names the first one to repeat (in input order) at its first two
    places; one file with no repeats passes."""
    from distributed_scoring.config import InputSpec
    from distributed_scoring.errors import UserError
    from distributed_scoring.io.ids import check_unique_ids
    from distributed_scoring.io.sources import plan_shards

    rng = random.Random(25)
    for trial in range(5):
        ids = [str(rng.randrange(400)) for _ in range(300)]
        jsonl, parquet = tmp_path / f"t{trial}.jsonl", tmp_path / f"t{trial}.parquet"
        jsonl.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in ids[:120]))
        pq.write_table(pa.table({"id": [int(i) for i in ids[120:]], "text": ["x"] * 180}), parquet, row_group_size=50)
        spec = InputSpec((str(jsonl), str(parquet)), id_column="id", shard_rows=37)
        counts = Counter(ids)
        first = next(i for i in ids if counts[i] > 1)
        places = [p for p, i in enumerate(ids) if i == first][:2]
        named = " and ".join(
            f"t{trial}.jsonl line {p + 1}" if p < 120 else f"t{trial}.parquet row {p - 119}" for p in places
        )
        with pytest.raises(UserError) as caught:
            check_unique_ids(plan_shards(spec), spec)
        message = str(caught.value)
        repeated = sum(c > 1 for c in counts.values())
        assert message.startswith(f"{repeated} ids of --id-column 'id' repeat: {first!r} at {named}")
    unique = tmp_path / "unique.parquet"
    pq.write_table(pa.table({"id": list(range(1_000_000)), "text": ["x"] * 1_000_000}), unique)
    spec = InputSpec((str(unique),), id_column="id", shard_rows=100_000)
    check_unique_ids(plan_shards(spec), spec)  # a million ids, read from their column alone
    pq.write_table(pa.table({"id": [*range(999_999), 5], "text": ["x"] * 1_000_000}), unique)
    with pytest.raises(UserError, match="'5' at unique.parquet row 6 and unique.parquet row 1000000"):
        check_unique_ids(plan_shards(spec), spec)
