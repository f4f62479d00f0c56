"""`dscore rescore` end to end: unique texts scored once through the pipeline, then tuned and applied."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.io import nbest
from distributed_scoring.offline.antibodies import v_genes

from helpers import rescoring as H


def write_jsonl(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_masked_and_causal_lms_in_process(tmp_path, tiny_model_dir, capsys):
    dev_records, _ = H.synthetic_nbest(6, 4, seed=1, prefix="d")
    test_records, _ = H.synthetic_nbest(6, 4, seed=2, prefix="t")
    dev, test = nbest.nbest_table(dev_records, "dev"), nbest.nbest_table(test_records, "test")
    dev_path, test_path = (
        write_jsonl(tmp_path / "dev.jsonl", dev_records),
        write_jsonl(tmp_path / "test.jsonl", test_records),
    )
    gpt2 = H.save_tiny_causal("gpt2", tmp_path / "gpt2")
    out = tmp_path / "out"
    rc = main(
        [
            "rescore",
            "--dev",
            dev_path,
            "--test",
            test_path,
            "--model",
            str(tiny_model_dir("bert")),
            "--causal-model",
            str(gpt2),
            "--append",
            " .",
            "--output",
            str(out),
            "--shard-rows",
            "7",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads((out / "report.json").read_text())
    assert {k: report[k] for k in printed} == printed
    assert {"baseline", "rescored", "oracle"} <= set(report["dev"]) and {"baseline", "rescored", "oracle"} <= set(
        report["test"]
    )
    assert report["lms"] == {"mlm": True, "causal": True} and 0 <= report["gamma"] <= 1
    # Each unique text is scored once by each LM, with the appended period, keyed back to the original.
    texts = nbest.unique_texts(dev, test)
    for lm in ("mlm", "causal"):
        rows = pq.read_table(out / lm / "rows").to_pylist()
        assert sorted(r["text"] for r in rows) == sorted(t + " ." for t in texts)
    hypotheses = pq.read_table(out / "hypotheses.parquet")
    assert hypotheses.num_rows == dev.num_rows + test.num_rows
    assert len((out / "test.best.txt").read_text().splitlines()) == len(set(test.column("utt_id").to_pylist()))


def test_references_from_separate_files_give_the_same_result(tmp_path, tiny_model_dir, capsys):
    """--dev-refs/--test-refs: the same lists with their references moved to files rescore alike."""
    model = str(tiny_model_dir("bert"))
    reports = []
    for separate in (False, True):
        args = ["rescore", "--model", model, "--output", str(tmp_path / f"out-{separate}")]
        for split, seed in (("dev", 1), ("test", 2)):
            records, _ = H.synthetic_nbest(5, 3, seed=seed, prefix=split[0])
            if separate:
                refs = {r["utt_id"]: r.pop("ref") for r in records}
                refs_path = write_jsonl(
                    tmp_path / f"{split}-refs.jsonl", [{"utt_id": u, "ref": t} for u, t in refs.items()]
                )
                args += [f"--{split}-refs", refs_path]
            args += [f"--{split}", write_jsonl(tmp_path / f"{split}-{separate}.jsonl", records)]
        assert main(args) == 0
        capsys.readouterr()
        reports.append(json.loads((tmp_path / f"out-{separate}" / "report.json").read_text()))
    for split in ("dev", "test"):
        assert reports[1][split] == reports[0][split]


@pytest.mark.ray
def test_antibody_rescoring_on_ray_lowers_the_residue_error_rate(ray_local, tmp_path, offline_model_dir, capsys):
    """Real weights: chains with substitutions and a noisy sequence-model score; Sapiens VH repairs the
    ranking, so the residue error rate (WER over space-separated residues) falls on held-out utterances."""
    genes = sorted(v_genes("human").items())
    picked = dict((name, seq[:30]) for name, seq in random.Random(4).sample(genes, 16))
    names = list(picked)
    dev = H.antibody_nbest({n: picked[n] for n in names[:8]}, n_best=5, max_substitutions=3, noise=1.0, seed=5)
    test = H.antibody_nbest({n: picked[n] for n in names[8:]}, n_best=5, max_substitutions=3, noise=1.0, seed=6)
    out = tmp_path / "out"
    rc = main(
        [
            "rescore",
            "--dev",
            write_jsonl(tmp_path / "dev.jsonl", dev.to_pylist()),
            "--test",
            write_jsonl(tmp_path / "test.jsonl", test.to_pylist()),
            "--model",
            str(offline_model_dir("sapiens-vh")),
            "--output",
            str(out),
            "--ray",
            "--shard-rows",
            "20",
        ]
    )
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == "wer" and report["lambda"] > 0
    assert report["test"]["baseline"] > 0
    assert report["test"]["rescored"] < report["test"]["baseline"], report["test"]
    assert report["test"]["oracle"] <= report["test"]["rescored"]


@pytest.mark.parametrize("flag", ["--causal-model", "--model"])
def test_a_model_that_cannot_load_stops_the_run_before_any_scoring(tmp_path, tiny_model_dir, capsys, flag):
    """Every model the run needs is checked first: a bad --causal-model used to fail only after the whole
    masked-LM pass."""
    records, _ = H.synthetic_nbest(3, 2, seed=1, prefix="d")
    path = write_jsonl(tmp_path / "n.jsonl", records)
    out = tmp_path / "out"
    models = {"--model": str(tiny_model_dir("bert")), "--causal-model": str(tiny_model_dir("bert"))}
    models[flag] = str(tmp_path / "no-such-model")
    rc = main(
        ["rescore", "--dev", path, "--test", path, *[x for kv in models.items() for x in kv], "--output", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "no-such-model" in err and len(err.strip().splitlines()) == 1
    assert not (out / "mlm").exists() and not (out / "texts").exists()


def test_the_report_gives_scoring_speed_and_counts_distinct_texts(tmp_path, tiny_model_dir):
    records, _ = H.synthetic_nbest(4, 3, seed=3, prefix="d")
    doubled = records + [dict(r, utt_id=r["utt_id"] + "-again") for r in records]  # every text twice
    path = write_jsonl(tmp_path / "n.jsonl", doubled)
    assert (
        main(
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
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    distinct = len({r["text"] for r in records})
    assert report["scoring"]["hypotheses"] == 2 * len(doubled) and report["scoring"]["unique_texts"] == distinct
    assert report["scoring"]["hypotheses_per_s"] > 0
    assert pq.read_table(tmp_path / "out" / "mlm" / "rows").num_rows == distinct


@pytest.mark.parametrize(
    "missing, suffix",
    [
        (flag, suffix)
        for flag in ("--dev", "--test", "--dev-refs", "--test-refs")
        for suffix in (".jsonl", ".json", ".parquet", ".tsv")
        if suffix != ".tsv" or flag.endswith("-refs")  # TSV: references only
    ],
)
def test_a_missing_nbest_or_reference_file_is_one_line(tmp_path, tiny_model_dir, capsys, missing, suffix):
    """It used to end in a FileNotFoundError traceback (exit 1), before any scoring."""
    records, _ = H.synthetic_nbest(2, 2, seed=4, prefix="d")
    path = write_jsonl(tmp_path / "n.jsonl", records)
    files = {"--dev": path, "--test": path}
    files[missing] = str(tmp_path / f"gone{suffix}")
    out, model = tmp_path / "out", str(tiny_model_dir("bert"))
    capsys.readouterr()  # (the fixture's progress bars when it builds the model)
    rc = main(["rescore", *[x for kv in files.items() for x in kv], "--model", model, "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"gone{suffix}" in err and "check the path" in err
    assert not (out / "mlm").exists()
