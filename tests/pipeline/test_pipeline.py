"""The Ray Data pipeline: same rows as in-process scoring, sizing. Kills mid-run: tests/faults/test_kills.py."""

from __future__ import annotations

import gzip
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.config import InputSpec, ModelSpec, RayOptions, RunConfig, ScoringOptions
from distributed_scoring.errors import UserError
from distributed_scoring.io import schema as S
from distributed_scoring.pipeline.cluster import cluster_address
from distributed_scoring.pipeline.on_ray import StallError, consume
from distributed_scoring.pipeline.resources import node_cpus, plan_resources
from distributed_scoring.workflows.score import score

RAY = RayOptions(stall_timeout_s=300)


def rows(out) -> dict[str, dict]:
    return {r[S.ID]: r for r in pq.read_table(out / "rows").to_pylist()}


@pytest.mark.ray
def test_pipeline_equals_in_process_on_mixed_inputs(ray_local, tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "plain.txt").write_bytes(
        "Hello there.\n\n  \nNaïve café ☃\n".encode() + b"\xff bad\n" + b"x " * 120 + b"\n"
    )
    with gzip.open(data / "packed.jsonl.gz", "wt") as f:
        f.write('{"text": "Compressed JSON lines."}\nnot json\n{"text": null}\n{"text": "Another one."}\n')
    pq.write_table(pa.table({"text": ["From Parquet.", "Second row."]}), data / "table.parquet")
    inputs = (f"file://{data}/plain.txt", str(data / "packed.jsonl.gz"), str(data / "table.parquet"))
    config = RunConfig(
        InputSpec(inputs, shard_rows=2),
        ModelSpec(str(tiny_model_dir("bert"))),
        ScoringOptions(variant="word_l2r", per_token=True),
        str(tmp_path / "local"),
    )
    local = score(config)
    ray_config = RunConfig(config.inputs, config.model, config.scoring, str(tmp_path / "ray"))
    distributed = score(ray_config, RAY)
    a, b = rows(tmp_path / "local"), rows(tmp_path / "ray")
    assert a.keys() == b.keys() and len(a) == 12
    for key in a:
        assert (a[key][S.STATUS], a[key][S.ERROR]) == (b[key][S.STATUS], b[key][S.ERROR]), key
        if a[key][S.STATUS] == "ok":
            assert a[key][S.PLL] == pytest.approx(b[key][S.PLL], abs=1e-5)
            assert a[key][S.TOKENS] == b[key][S.TOKENS]
    assert {k for k, v in b.items() if v[S.STATUS] == "error"} == {
        "plain.txt:2",
        "plain.txt:3",
        "plain.txt:5",
        "packed.jsonl.gz:2",
        "packed.jsonl.gz:3",
    }
    assert [k for k, v in b.items() if v[S.WINDOWED]] == ["plain.txt:6"]  # 120 tokens: in windows, on Ray too
    assert local["windowed_rows"] == distributed["windowed_rows"] == 1
    for key in ("rows", "ok", "errors", "n_tokens", "n_words"):
        assert local[key] == distributed[key]
    assert distributed["sum_pll"] == pytest.approx(local["sum_pll"], abs=1e-4)
    assert {v[S.MODEL] for v in b.values()} == {config.model.name}


def nodes(*cpus: float, gpus: float = 0) -> list[dict]:
    """`ray.nodes()` entries of alive nodes with these CPUs (GPUs on the first)."""
    return [
        {"Alive": True, "Resources": {"CPU": c, **({"GPU": gpus} if gpus and i == 0 else {})}}
        for i, c in enumerate(cpus)
    ] + [{"Alive": False, "Resources": {"CPU": 64.0}}]  # a dead node never counts


@pytest.mark.parametrize(
    "cluster, options, device, expected",
    [
        (nodes(4), RayOptions(), "auto", (1, 2.0, 0.0, 2, (1, 1))),  # embedded Ray on 2 cores
        (nodes(64), RayOptions(), "auto", (15, 4.0, 0.0, 4, (1, 3))),
        (nodes(64, gpus=8), RayOptions(), "auto", (8, 1.0, 1.0, 1, (1, 8))),
        (nodes(64, gpus=8), RayOptions(num_actors=2), "cpu", (2, 4.0, 0.0, 4, (1, 2))),
        # local_cluster.sh start --workers 2 --cpus 2: no 4-CPU actor fits any node; one node stays free
        (nodes(2, 2, 2), RayOptions(), "auto", (2, 2.0, 0.0, 2, (1, 1))),
        (nodes(8, 8, 8, 8), RayOptions(), "auto", (7, 4.0, 0.0, 4, (1, 3))),
        # actors asked for, their CPUs not: sized to fit (a 2-core machine)
        (nodes(4), RayOptions(num_actors=2), "cpu", (2, 1.25, 0.0, 1, (1, 1))),
        (nodes(2, 2, 2), RayOptions(num_actors=4), "cpu", (4, 1.0, 0.0, 1, (1, 1))),
        (nodes(2), RayOptions(num_actors=3), "cpu", (3, 0.16, 0.0, 1, (1, 1))),  # below a quarter: hundredths
        # a joined 2-CPU node: no whole CPU leaves 1.5 for the other stages, half of one does
        (nodes(2), RayOptions(), "cpu", (1, 0.5, 0.0, 1, (1, 1))),
        # a GPU per actor, and the CPUs per actor sized down so that the other stages keep 1.5
        (nodes(4, gpus=4), RayOptions(), "auto", (4, 0.5, 1.0, 1, (1, 1))),
        (nodes(4, gpus=4), RayOptions(num_actors=2), "auto", (2, 1.0, 1.0, 1, (1, 1))),
    ],
)
def test_resources_leave_cpus_for_the_other_stages(cluster, options, device, expected):
    r = plan_resources(cluster, options, device)
    assert (r.actors, r.cpus_per_actor, r.gpus_per_actor, r.threads_per_actor, r.prepare_actors) == expected
    assert sum(node_cpus(cluster)) - r.actors * r.cpus_per_actor >= 1.5


def test_no_more_actors_start_than_there_are_shards_to_score():
    planned = plan_resources(nodes(64), RayOptions(), "auto")
    assert (planned.actors, planned.prepare_actors) == (15, (1, 3))
    for shards, actors, prepare in ((1, 1, (1, 1)), (2, 2, (1, 2)), (15, 15, (1, 3)), (1000, 15, (1, 3))):
        capped = planned.at_most(shards)
        assert (capped.actors, capped.prepare_actors) == (actors, prepare)
        assert (capped.cpus_per_actor, capped.threads_per_actor) == (4.0, 4)  # each actor as planned
    assert str(planned.at_most(1)).startswith("1 scoring actor x 4 CPU (4 torch threads each), 1-1 tokenising")
    gpus = plan_resources(nodes(64, gpus=8), RayOptions(), "auto").at_most(3)
    assert (gpus.actors, gpus.gpus_per_actor) == (3, 1.0)  # GPUs left to other jobs


def test_resource_requests_that_cannot_work_are_refused():
    with pytest.raises(UserError, match="do not fit"):
        plan_resources(nodes(4), RayOptions(num_actors=2, cpus_per_actor=2), "cpu")
    with pytest.raises(UserError, match="--device cuda:1 picks one GPU.*use --device cuda"):
        plan_resources(nodes(2, gpus=2), RayOptions(), "cuda:1")
    with pytest.raises(UserError, match="no node can hold a scoring actor of 4 CPUs"):
        plan_resources(nodes(2, 2, 2), RayOptions(cpus_per_actor=4), "cpu")
    with pytest.raises(UserError, match="no scoring actor fits.*add CPUs"):
        plan_resources(nodes(1), RayOptions(), "cpu")
    with pytest.raises(UserError, match="300 scoring actors do not fit.*even at a hundredth.*lower --num-actors"):
        plan_resources(nodes(2), RayOptions(num_actors=300), "cpu")
    with pytest.raises(UserError, match="2 GPU actors x 1 CPUs do not fit"):
        plan_resources(nodes(2, gpus=2), RayOptions(cpus_per_actor=1), "auto")
    with pytest.raises(UserError, match="GPU actors leave no CPUs"):
        plan_resources(nodes(1, gpus=1), RayOptions(), "auto")
    with pytest.raises(UserError, match="no GPUs"):
        plan_resources(nodes(8), RayOptions(), "cuda")
    with pytest.raises(UserError, match="need 4 GPUs"):
        plan_resources(nodes(8, gpus=2), RayOptions(num_actors=4), "auto")


@pytest.mark.parametrize(
    "given, env, expected",
    [
        ("10.0.0.1:6379", {}, "10.0.0.1:6379"),
        (None, {"DSCORE_RAY_ADDRESS": "127.0.0.1:6390", "RAY_ADDRESS": "http://127.0.0.1:8275"}, "127.0.0.1:6390"),
        (None, {"RAY_ADDRESS": "auto"}, "auto"),
        (None, {}, None),
    ],
)
def test_the_cluster_address_a_driver_joins(monkeypatch, given, env, expected):
    for name in ("DSCORE_RAY_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cluster_address(given) == expected


def test_a_job_server_address_is_refused_with_the_one_to_use(monkeypatch):
    monkeypatch.delenv("DSCORE_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8275")
    with pytest.raises(UserError, match="job server's address.*--address HOST:PORT"):
        cluster_address(None)


def test_no_progress_turns_into_an_error():
    def slow():
        yield {"rows": 1}
        time.sleep(5)
        yield {"rows": 1}

    seen = []
    with pytest.raises(StallError, match="no shard finished"):
        consume(slow(), seen.append, stall_timeout_s=0.5)
    assert seen == [{"rows": 1}]


def test_a_stall_ends_the_command_with_exit_1_and_one_line(tmp_path, monkeypatch, capsys):
    """StallError is a DataLossError: the CLI prints it as one line (no traceback) and exits 1, so a
    rerun (which resumes) is what the user is told to do."""
    from distributed_scoring.cli import main
    from distributed_scoring.workflows import score as score_workflow

    def stalled(*args, **kwargs):
        def slow():
            yield {"rows": 1}
            time.sleep(5)

        consume(slow(), lambda _: None, stall_timeout_s=0.2)

    monkeypatch.setattr(score_workflow, "score", stalled)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the fox\n")
    rc = main(["score", str(corpus), "--model", "unused", "--output", str(tmp_path / "out"), "--ray"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("dscore: incomplete: no shard finished") and "rerun to resume" in err


def test_small_read_units_travel_together_and_every_shard_once():
    """Ray Data's items group consecutive read units up to shard_rows rows: 10^4 small files make ~100
    tasks, not 10^4; a unit is never split, a full-size one keeps an item of its own, the order is kept."""
    import json

    from distributed_scoring.io.inputs import InputFile
    from distributed_scoring.io.sources import Shard
    from distributed_scoring.pipeline.on_ray import UNIT, _items

    def unit(index: int, *sizes: int) -> list[Shard]:
        f = InputFile(index=index, path=f"f{index}.txt", name=f"f{index}.txt", fmt="text")
        return [Shard(f, 100 * i, n) for i, n in enumerate(sizes)]

    units = [unit(i, 10) for i in range(25)] + [unit(25, 100, 100, 7)] + [unit(26, 100)] + [unit(27, 3), unit(28, 0)]
    items = [[[Shard.from_json(s) for s in u] for u in json.loads(item[UNIT])] for item in _items(units, 100)]
    assert [u for item in items for u in item] == units
    sizes = [sum(s.rows for u in item for s in u) for item in items]
    assert sizes == [100, 100, 50, 207, 100, 3]


@pytest.mark.ray
def test_a_small_corpus_on_ray_has_a_shard_for_every_scoring_actor(ray_local, tmp_path, tiny_model_dir, caplog):
    """12 rows at the default of 1000 rows a shard used to be one shard, so one of 3 scoring actors
    worked. Left to the default, the shards are made smaller (said in the log); a rerun on a Ray that starts
    fewer actors resumes the recorded shards; a --shard-rows given, or a run in this process, keeps its size."""
    import json

    corpus = tmp_path / "small.txt"
    corpus.write_text("".join(f"Sentence number {i} is here.\n" for i in range(12)))

    def run(folder: str, ray: RayOptions | None, fit: bool = True) -> dict:
        spec = InputSpec((str(corpus),), fit_actors=fit)
        score(RunConfig(spec, ModelSpec(str(tiny_model_dir("bert"))), ScoringOptions(), str(tmp_path / folder)), ray)
        return json.loads((tmp_path / folder / "_run.json").read_text())

    three = RayOptions(num_actors=3, stall_timeout_s=300)
    with caplog.at_level("INFO"):
        run_json = run("fitted", three)
    assert run_json["shard_rows"] == 4 and sorted(run_json["shards"].values()) == [4, 4, 4]
    assert "12 rows in 3 shards of up to 4 rows, so that each of the 3 scoring actors has one" in caplog.text
    assert pq.read_table(tmp_path / "fitted" / "rows").num_rows == 12
    caplog.clear()
    with caplog.at_level("INFO"):
        assert run("fitted", RayOptions(num_actors=2, stall_timeout_s=300))["shard_rows"] == 4
    assert "already complete: all 3 of its shards were scored before" in caplog.text
    assert run("given", three, fit=False)["shard_rows"] == 1000
    assert list(run("in-process", None)["shards"].values()) == [12]


def test_shard_rows_left_out_is_the_commands_default_fitted_to_the_actors():
    from distributed_scoring.cli import build_parser
    from distributed_scoring.cli.common import run_config

    parser = build_parser()
    left_out = run_config(parser.parse_args(["score", "in.txt", "--model", "m", "--output", "o"])).inputs
    given = run_config(parser.parse_args(["score", "in.txt", "--model", "m", "--output", "o", "--shard-rows", "7"]))
    assert (left_out.shard_rows, left_out.fit_actors) == (1000, True)
    assert (given.inputs.shard_rows, given.inputs.fit_actors) == (7, False)
