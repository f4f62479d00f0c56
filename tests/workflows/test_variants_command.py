"""`dscore variants` end to end: every strategy's score of every row against the naive float64 reference (joined
by `mutant`), the error rows and what they say, the forward passes the summary reports, the per-assay statistics,
many assays through ProteinGym's reference file, `--offset`, wild types longer than the model's window, the
refusals before work, resume, `verify`, and Ray."""

from __future__ import annotations

import csv
import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm

from helpers.cli import refusal
from helpers.reference import NaiveVariants

WILD = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"  # 30 residues: one window of the tiny models
STRATEGIES = ("wt-marginal", "masked-marginal", "mutant-marginal", "pll")
GOOD = ["M1A", "K2R", "T3S", "A4G", "Q9E", "I30V", "K2R:T3S", "A4G:Q9E", "M1L:S13T:I30F", "K2K"]
BAD = {  # mutant -> what its error row must say
    "X9E": "residue 9 of the target is Q, not X",
    "Q99E": "position 99",
    "K2R:K2A": "mutated twice",
    "K2": "not a substitution",
    "K2J": "not in the model's alphabet",
}
INDEL = "MKTAYIAKQRGQISFVKSHFSRQLEERLGLI"  # one residue inserted after Q10


def sites(mutant: str, offset: int = 1) -> list[tuple[int, str, str]]:
    """The test's own reading of a mutant name: 0-based (position, wild type, mutant) of each substitution."""
    return [(int(p[1:-1]) - offset, p[0], p[-1]) for p in mutant.split(":")]


def applied(wild: str, mutant: str, offset: int = 1) -> str:
    residues = list(wild)
    for i, _, mt in sites(mutant, offset):
        residues[i] = mt
    return "".join(residues)


def write_table(path: Path, wild: str, mutants: list[str], offset: int = 1, indel: str | None = None) -> Path:
    """A ProteinGym-style CSV with a column of its own (`note`) that the output must keep."""
    rng = np.random.default_rng(len(mutants))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mutant", "mutated_sequence", "DMS_score", "DMS_score_bin", "note"])
        for k, m in enumerate(mutants):
            try:
                sequence = applied(wild, m, offset) if m not in BAD else ""
            except (ValueError, IndexError):
                sequence = ""
            writer.writerow([m, sequence, f"{rng.normal():.4f}", k % 2, f"row {k}"])
        if indel is not None:
            writer.writerow(["ins", indel, "0.5", 1, "indel"])
    return path


def run(*args: str) -> tuple[int, dict | None]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue()) if code == 0 else None


def rows_of(folder: Path) -> dict[str, dict]:
    return {r["mutant"]: r for r in pq.read_table(folder / "variants.parquet").to_pylist()}


def naive(folder) -> NaiveVariants:
    mlm = load_masked_lm(ModelSpec(str(folder), dtype="float64"))
    return NaiveVariants(mlm.model, mlm.tokenizer)


def close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(b))


@pytest.mark.parametrize("family", ["bert", "esm"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_row_scores_as_the_naive_reference(tmp_path, tiny_protein_dir, strategy, family):
    model = tiny_protein_dir(family)
    table = write_table(tmp_path / "assay.csv", WILD, GOOD + list(BAD), indel=INDEL)
    code, summary = run(
        "variants", str(table), "--model", str(model), "--target-seq", WILD, "--strategy", strategy,
        "--output", str(tmp_path / "out"), "--batch-tokens", "200",
    )  # fmt: skip
    assert code == 0
    rows = rows_of(tmp_path / "out")
    assert len(rows) == len(GOOD) + len(BAD) + 1
    columns = pq.read_table(tmp_path / "out" / "variants.parquet").column_names
    assert columns == ["mutant", "mutated_sequence", "DMS_score", "DMS_score_bin", "note", "DMS_id", "score",
                       "n_mutations", "status", "error"]  # fmt: skip
    reference = naive(model)
    expected = reference.scores(strategy, WILD, [sites(m) for m in GOOD])
    for mutant, want in zip(GOOD, expected):
        row = rows[mutant]
        assert row["status"] == "ok" and row["n_mutations"] == len(sites(mutant)) and row["DMS_id"] == "assay"
        assert close(row["score"], want), (mutant, row["score"], want)
    for mutant, message in BAD.items():
        assert rows[mutant]["status"] == "error" and message in rows[mutant]["error"], rows[mutant]
        assert rows[mutant]["score"] is None and rows[mutant]["note"].startswith("row ")
    indel = rows["ins"]
    if strategy == "pll":  # an indel is a sequence like any other to the PLL
        assert indel["status"] == "ok" and indel["n_mutations"] is None
        assert close(indel["score"], reference.pll(INDEL) - reference.pll(WILD))
    else:
        assert indel["status"] == "error" and "indel" in indel["error"], indel
    ok = len(GOOD) + (strategy == "pll")
    assert (summary["variants"], summary["ok"], summary["errors"]) == (len(rows), ok, len(rows) - ok)
    positions = {i for m in GOOD for i, _, _ in sites(m)}
    # K2J too: the PLL reads any tokenisation, so its sequence is scored and then refused for its unknown token
    sequences = {applied(WILD, m) for m in [*GOOD, "K2J"]} | {WILD, INDEL}
    passes = {
        "wt-marginal": 1,
        "masked-marginal": len(positions),  # one masked copy per mutated position, for the whole table
        "mutant-marginal": len(GOOD),
        "pll": sum(len(s) for s in sequences),  # every distinct sequence once, each residue masked once
    }
    assert summary["forward_passes"] == passes[strategy]


def test_statistics_against_pandas_and_every_pair(tmp_path, tiny_protein_dir):
    """Spearman as pandas ranks and correlates; the AUC as the share of (positive, negative) pairs in order."""
    table = write_table(tmp_path / "assay.csv", WILD, GOOD)
    code, summary = run(
        "variants", str(table), "--model", str(tiny_protein_dir("bert")), "--target-seq", WILD,
        "--strategy", "masked-marginal", "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0
    frame = pd.read_parquet(tmp_path / "out" / "variants.parquet")
    figures = summary["by_assay"]["assay"]
    rho = frame["score"].rank().corr(frame["DMS_score"].rank())
    assert math.isclose(figures["spearman"]["value"], rho, abs_tol=1e-12)
    low, high = figures["spearman"]["interval"]
    assert -1 <= low <= rho <= high <= 1 and figures["spearman"]["n"] == len(GOOD)
    positive = frame[frame["DMS_score_bin"] == 1]["score"].to_numpy()
    negative = frame[frame["DMS_score_bin"] == 0]["score"].to_numpy()
    pairs = [(p > n) + 0.5 * (p == n) for p in positive for n in negative]
    assert math.isclose(figures["auc"]["value"], sum(pairs) / len(pairs), abs_tol=1e-12)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| assay | 30 | 10 | 10 |" in report and (tmp_path / "out" / "scatter.png").read_bytes()[:4] == b"\x89PNG"


def test_masked_marginal_of_every_single_mutant_costs_l_passes(tmp_path, tiny_protein_dir):
    wild = WILD[:12]
    singles = [f"{w}{i + 1}{a}" for i, w in enumerate(wild) for a in "ACDEFGHIKLMNPQRSTVWY" if a != w]
    table = write_table(tmp_path / "singles.csv", wild, singles)
    model = tiny_protein_dir("bert")
    code, summary = run(
        "variants", str(table), "--model", str(model), "--target-seq", wild, "--strategy", "masked-marginal",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0 and summary["variants"] == summary["ok"] == 19 * len(wild)
    assert summary["forward_passes"] == len(wild)  # 228 variants, 12 masked passes
    rows = rows_of(tmp_path / "out")
    expected = naive(model).masked_marginal(wild, [sites(m) for m in singles])
    assert all(close(rows[m]["score"], e) for m, e in zip(singles, expected))


def test_many_assays_through_the_reference_file_and_offset(tmp_path, tiny_protein_dir):
    """Two assays in one run, their tables in a folder the reference names; the second numbers its positions
    from 101 (`--offset` applies to every table, so it is given its own run) and scores as the first does."""
    other = "GSHMLEDPVAGKTAYIAKQRQISFVKSHF"
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables / "A_2024.csv", WILD, GOOD[:6])
    write_table(tables / "B_2025.csv", other, ["G1A", "H3K:M4L"])
    reference = tmp_path / "reference.csv"
    reference.write_text(
        f"DMS_id,DMS_filename,target_seq,UniProt_ID\nA_2024,A_2024.csv,{WILD},P1\nB_2025,B_2025.csv,{other},P2\n"
    )
    model = tiny_protein_dir("bert")
    code, summary = run(
        "variants", str(tables), "--model", str(model), "--reference", str(reference), "--strategy", "wt-marginal",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0 and summary["assays"] == 2 and summary["forward_passes"] == 2
    frame = pq.read_table(tmp_path / "out" / "variants.parquet").to_pylist()
    by_assay = {(r["DMS_id"], r["mutant"]): r["score"] for r in frame}
    reference_scores = naive(model)
    for assay, wild, mutants in (("A_2024", WILD, GOOD[:6]), ("B_2025", other, ["G1A", "H3K:M4L"])):
        expected = reference_scores.wt_marginal(wild, [sites(m) for m in mutants])
        assert all(close(by_assay[(assay, m)], e) for m, e in zip(mutants, expected))
        assert summary["by_assay"][assay]["variants"] == len(mutants)
    shifted = [":".join(f"{w}{i + 101}{mt}" for i, w, mt in sites(m)) for m in GOOD[:6]]
    write_table(tmp_path / "shifted.csv", WILD, shifted, offset=101)
    code, _ = run(
        "variants", str(tmp_path / "shifted.csv"), "--model", str(model), "--target-seq", WILD, "--offset", "101",
        "--strategy", "wt-marginal", "--output", str(tmp_path / "shifted"),
    )  # fmt: skip
    assert code == 0
    moved = rows_of(tmp_path / "shifted")
    assert all(moved[s]["score"] == by_assay[("A_2024", m)] for s, m in zip(shifted, GOOD[:6]))


def windowed(reference: NaiveVariants, sequence: str, i: int, width: int, masked: bool) -> np.ndarray:
    """log p(. at residue i) read in the window of `width` residues centred on i (held inside the sequence),
    the rule of docs/score.md "Long texts", computed on that window alone."""
    start = min(max(i - width // 2, 0), len(sequence) - width)
    window = sequence[start : start + width]
    ids, positions = reference.encode(window)
    if masked:
        ids = list(ids)
        ids[positions[i - start]] = reference.tokenizer.mask_token_id
    return reference.logprobs(ids)[positions[i - start]].numpy()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_wild_type_longer_than_the_window_is_read_in_windows(tmp_path, tiny_protein_dir, strategy):
    model = tiny_protein_dir("bert")
    mlm = load_masked_lm(ModelSpec(str(model)))
    width = mlm.max_length - 2  # [CLS] and [SEP] around the residues
    wild = (WILD * 6)[: width + 40]
    mutants = ["M1A", f"{wild[69]}70A", f"{wild[-1]}{len(wild)}A", f"K2R:{wild[99]}100C"]
    table = write_table(tmp_path / "long.csv", wild, mutants)
    code, summary = run(
        "variants", str(table), "--model", str(model), "--target-seq", wild, "--strategy", strategy,
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0 and summary["ok"] == len(mutants)
    reference, rows = naive(model), rows_of(tmp_path / "out")
    token = reference.residue_id

    def marginal(sequence: str, mutant: str, masked: bool) -> float:
        return sum(
            windowed(reference, sequence, i, width, masked)[token(mt)]
            - windowed(reference, sequence, i, width, masked)[token(wt)]
            for i, wt, mt in sites(mutant)
        )

    def pll(sequence: str) -> float:
        return sum(windowed(reference, sequence, i, width, True)[token(r)] for i, r in enumerate(sequence))

    for mutant in mutants:
        if strategy == "pll":
            want = pll(applied(wild, mutant)) - pll(wild)
        else:
            read = applied(wild, mutant) if strategy == "mutant-marginal" else wild
            want = marginal(read, mutant, strategy == "masked-marginal")
        assert close(rows[mutant]["score"], want), (mutant, rows[mutant]["score"], want)


def test_refused_before_any_work(tmp_path, tiny_protein_dir, tiny_model_dir, capsys):
    protein = str(tiny_protein_dir("bert"))
    table = write_table(tmp_path / "assay.csv", WILD, GOOD)
    common = ["--target-seq", WILD, "--strategy", "masked-marginal"]
    repeated = write_table(tmp_path / "repeated.csv", WILD, ["K2R", "A4G", "K2R"])
    line = refusal(capsys, ["variants", str(repeated), "--model", protein, *common, "--output", str(tmp_path / "a")])
    assert "'K2R' appears twice" in line
    reordered = write_table(tmp_path / "reordered.csv", WILD, ["K2R:T3S", "A4G", "t3s:k2r"])
    line = refusal(capsys, ["variants", str(reordered), "--model", protein, *common, "--output", str(tmp_path / "a")])
    assert "'K2R:T3S' (row 1) and 't3s:k2r' (row 3) name the same variant" in line
    english = str(tiny_model_dir("bert"))
    line = refusal(capsys, ["variants", str(table), "--model", english, *common, "--output", str(tmp_path / "b")])
    assert "does not give one token per residue" in line and "--strategy pll" in line
    (tmp_path / "plain.csv").write_text("sequence,value\nMKT,1\n")
    line = refusal(
        capsys, ["variants", str(tmp_path / "plain.csv"), "--model", protein, *common, "--output", str(tmp_path / "c")]
    )
    assert "neither a `mutant` nor a `mutated_sequence` column" in line
    line = refusal(
        capsys, ["variants", str(tmp_path / "x.txt"), "--model", protein, *common, "--output", str(tmp_path / "d")]
    )
    assert ".csv, .jsonl or .parquet" in line
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_tables_in_every_format_resume_and_verify(tmp_path, tiny_protein_dir, capsys):
    model = str(tiny_protein_dir("bert"))
    table = write_table(tmp_path / "assay.csv", WILD, GOOD)
    frame = pd.read_csv(table)
    frame.to_json(tmp_path / "assay.jsonl", orient="records", lines=True)
    frame.to_parquet(tmp_path / "assay.parquet")
    common = ["--model", model, "--target-seq", WILD, "--strategy", "mutant-marginal"]
    scores = []
    for name in ("assay.csv", "assay.jsonl", "assay.parquet"):
        out = tmp_path / name.replace(".", "-")
        code, summary = run("variants", str(tmp_path / name), *common, "--output", str(out))
        assert code == 0 and summary["ok"] == len(GOOD)
        scores.append({m: r["score"] for m, r in rows_of(out).items()})
    assert scores[0] == scores[1] == scores[2]
    out = tmp_path / "assay-csv"
    code, again = run("variants", str(table), *common, "--output", str(out))
    assert code == 0 and {m: r["score"] for m, r in rows_of(out).items()} == scores[0]
    assert main(["verify", str(out)]) == 0
    line = refusal(capsys, ["variants", str(table), *common[:-1], "pll", "--output", str(out)])
    assert "different run" in line and "strategy" in line
    code, _ = run("variants", str(table), *common[:-1], "pll", "--output", str(out), "--overwrite")
    assert code == 0 and main(["verify", str(out)]) == 0


@pytest.mark.ray
@pytest.mark.parametrize("strategy", ["masked-marginal", "pll"])
def test_on_ray_the_scores_equal_in_process(tmp_path, tiny_protein_dir, ray_local, strategy):
    """Three assays, sharded by wild type across the actors, then joined to their variants by key."""
    model = str(tiny_protein_dir("bert"))
    tables = tmp_path / "tables"
    tables.mkdir()
    lines = ["DMS_id,DMS_filename,target_seq"]
    for k, wild in enumerate((WILD, WILD[::-1], WILD[5:] + WILD[:5])):
        mutants = [f"{wild[i]}{i + 1}{'A' if wild[i] != 'A' else 'G'}" for i in range(0, 30, 3 + k)]
        write_table(tables / f"a{k}.csv", wild, mutants)
        lines.append(f"a{k},a{k}.csv,{wild}")
    (tmp_path / "reference.csv").write_text("\n".join(lines) + "\n")
    common = ["--model", model, "--reference", str(tmp_path / "reference.csv"), "--strategy", strategy]
    code, local = run("variants", str(tables), *common, "--output", str(tmp_path / "local"))
    code_ray, on_ray = run(
        "variants", str(tables), *common, "--output", str(tmp_path / "ray"), "--ray", "--shard-rows", "1"
    )
    assert code == code_ray == 0 and local["forward_passes"] == on_ray["forward_passes"]
    a = pq.read_table(tmp_path / "local" / "variants.parquet").to_pylist()
    b = {(r["DMS_id"], r["mutant"]): r for r in pq.read_table(tmp_path / "ray" / "variants.parquet").to_pylist()}
    assert len(a) == len(b) == local["variants"]
    assert all(close(r["score"], b[(r["DMS_id"], r["mutant"])]["score"]) for r in a)
    assert main(["verify", str(tmp_path / "ray")]) == 0


def test_an_edited_table_is_another_run_refused_before_any_byte(tmp_path, tiny_protein_dir, capsys):
    """The folder records what its tables make the model read: adding a variant to the table and rerunning is
    refused before the folder changes (its generated input and its rows as they were)."""
    model = str(tiny_protein_dir("bert"))
    table = write_table(tmp_path / "assay.csv", WILD, GOOD[:4])
    common = [str(table), "--model", model, "--target-seq", WILD, "--strategy", "masked-marginal"]
    code, _ = run("variants", *common, "--output", str(tmp_path / "out"))
    assert code == 0
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    write_table(table, WILD, GOOD[:5])
    line = refusal(capsys, ["variants", *common, "--output", str(tmp_path / "out")])
    assert "different run" in line and "sequences_to_score" in line
    assert {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before
    write_table(table, WILD, GOOD[:4])  # the table as it was, new measurements aside: the same run
    code, again = run("variants", *common, "--output", str(tmp_path / "out"))
    assert code == 0 and again["ok"] == 4


def test_long_texts_error_makes_a_long_wild_type_an_error_row_under_every_strategy(tmp_path, tiny_protein_dir):
    model = tiny_protein_dir("bert")
    wild = (WILD * 6)[:150]
    table = write_table(tmp_path / "long.csv", wild, ["M1A", "K2R"])
    for strategy in STRATEGIES:
        out = tmp_path / strategy
        code, summary = run(
            "variants", str(table), "--model", str(model), "--target-seq", wild, "--strategy", strategy,
            "--long-texts", "error", "--output", str(out),
        )  # fmt: skip
        assert code == 0 and summary["ok"] == 0 and summary["errors"] == 2, strategy
        assert all("over the model's maximum" in r["error"] for r in rows_of(out).values()), rows_of(out)


def test_tables_and_folder_on_s3_equal_a_local_run(tmp_path, tiny_protein_dir, s3, capsys):
    """The reference file and the tables read from the S3 server the tests start, the folder written there: the
    same rows as a local run, `verify` OK, a rerun resumes, another strategy is refused."""
    model = str(tiny_protein_dir("bert"))
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables / "A.csv", WILD, GOOD[:6])
    write_table(tables / "B.csv", WILD[::-1], ["I1V", "L2A:G3C"])
    (tables / "reference.csv").write_text(f"DMS_id,DMS_filename,target_seq\nA,A.csv,{WILD}\nB,B.csv,{WILD[::-1]}\n")
    s3.upload(tables, "dms")
    common = ["--model", model, "--strategy", "masked-marginal"]
    local = ["variants", str(tables), "--reference", str(tables / "reference.csv"), *common]
    code, here = run(*local, "--output", str(tmp_path / "local"))
    remote = ["variants", s3.uri("dms"), "--reference", s3.uri("dms/reference.csv"), *common]
    code_s3, there = run(*remote, "--output", s3.uri("out"))
    assert code == code_s3 == 0 and here["forward_passes"] == there["forward_passes"] and there["ok"] == 8
    expected = {
        (r["DMS_id"], r["mutant"]): r for r in pq.read_table(tmp_path / "local" / "variants.parquet").to_pylist()
    }
    got = pq.read_table(s3.uri("out/variants.parquet")).to_pylist()
    assert {(r["DMS_id"], r["mutant"]): r["score"] for r in got} == {k: r["score"] for k, r in expected.items()}
    assert main(["verify", s3.uri("out")]) == 0
    code, again = run(*remote, "--output", s3.uri("out"))
    assert code == 0 and again["ok"] == 8
    line = refusal(capsys, [*remote[:-1], "pll", "--output", s3.uri("out")])
    assert "different run" in line


def test_a_measurement_that_is_not_a_number_skips_the_statistics_with_the_reason(tmp_path, tiny_protein_dir):
    """`high` and `n/a` among the DMS_scores: every variant scored, the Spearman skipped with the values that are not
    numbers, exit 0; beside an assay whose DMS_score is numeric, both written in one table (the column as strings)."""
    tables = tmp_path / "tables"
    tables.mkdir()
    write_table(tables / "A.csv", WILD, GOOD[:4])
    (tables / "B.csv").write_text("mutant,DMS_score\nM1A,high\nK2R,n/a\nT3S,0.5\nA4G,\n")
    (tmp_path / "reference.csv").write_text(f"DMS_id,DMS_filename,target_seq\nA,A.csv,{WILD}\nB,B.csv,{WILD}\n")
    model = str(tiny_protein_dir("bert"))
    single = ["variants", str(tables / "B.csv"), "--model", model, "--target-seq", WILD, "--strategy", "wt-marginal"]
    code, summary = run(*single, "--output", str(tmp_path / "one"))
    assert code == 0 and summary["ok"] == 4
    why = "DMS_score is not numeric: 2 of 4 values are not numbers (e.g. 'high', 'n/a')"
    spearman = summary["by_assay"]["B"]["spearman"]
    assert spearman["value"] is None and spearman["reason"] == why
    assert why in (tmp_path / "one" / "report.md").read_text() and main(["verify", str(tmp_path / "one")]) == 0
    both = ["variants", str(tables), "--model", model, "--reference", str(tmp_path / "reference.csv")]
    code, summary = run(*both, "--strategy", "wt-marginal", "--output", str(tmp_path / "two"))
    assert code == 0 and summary["by_assay"]["B"]["spearman"]["reason"] == why
    assert summary["by_assay"]["A"]["spearman"]["value"] is not None
    rows = pq.read_table(tmp_path / "two" / "variants.parquet").to_pylist()
    assert [r["DMS_score"] for r in rows if r["DMS_id"] == "B"] == ["high", "n/a", "0.5", ""]
    assert len(rows) == 8 and main(["verify", str(tmp_path / "two")]) == 0


@pytest.mark.parametrize("strategy", ["masked-marginal", "pll"])
def test_tables_with_no_variant_to_score_are_error_rows(tmp_path, tiny_protein_dir, strategy):
    """Nothing for the model to read (positions outside the target, `mutant`s that are numbers, a header alone, an
    assay the reference gives no target_seq, an indel under a marginal): every row an error row that says why,
    exit 0, no scoring run, a folder `verify` finds complete and a rerun finds done."""
    tables = tmp_path / "tables"
    tables.mkdir()
    says = {"outside": "outside the target", "numbers": "not a substitution", "none": "has no target_seq"}
    (tables / "outside.csv").write_text("mutant,DMS_score\nM99A,1\nK77R,2\n")
    (tables / "numbers.csv").write_text("mutant,DMS_score\n1,1\n2,2\n")
    (tables / "header.csv").write_text("mutant,DMS_score\n")
    (tables / "none.csv").write_text("mutant,DMS_score\nM1A,1\n")
    listed = [
        f"{name},{name}.csv,{'' if name == 'none' else WILD}" for name in ("outside", "numbers", "header", "none")
    ]
    if strategy != "pll":  # the PLL scores an indel
        (tables / "indel.csv").write_text(f"mutant,mutated_sequence,DMS_score\nins,{INDEL},1\n")
        listed.append(f"indel,indel.csv,{WILD}")
        says["indel"] = "indel"
    (tmp_path / "reference.csv").write_text("DMS_id,DMS_filename,target_seq\n" + "\n".join(listed) + "\n")
    command = ["variants", str(tables), "--model", str(tiny_protein_dir("bert")), "--strategy", strategy,
               "--reference", str(tmp_path / "reference.csv"), "--output", str(tmp_path / "out")]  # fmt: skip
    code, summary = run(*command)
    assert code == 0 and summary["ok"] == summary["forward_passes"] == 0
    rows = pq.read_table(tmp_path / "out" / "variants.parquet").to_pylist()
    assert len(rows) == summary["errors"] == 5 + (strategy != "pll")
    assert all(r["status"] == "error" and says[r["DMS_id"]] in r["error"] for r in rows), rows
    assert not (tmp_path / "out" / "sites").exists() and not (tmp_path / "out" / "pll").exists()
    assert main(["verify", str(tmp_path / "out")]) == 0
    code, again = run(*command)
    assert code == 0 and again["errors"] == summary["errors"]


def test_a_lower_case_wild_type_scores_as_upper_case_from_the_reference_and_the_flag(tmp_path, tiny_protein_dir):
    table = write_table(tmp_path / "assay.csv", WILD, GOOD[:3])
    (tmp_path / "reference.csv").write_text(f"DMS_id,DMS_filename,target_seq\nassay,assay.csv,{WILD.lower()}\n")
    common = ["variants", str(table), "--model", str(tiny_protein_dir("bert")), "--strategy", "wt-marginal"]
    code, flag = run(*common, "--target-seq", WILD.lower(), "--output", str(tmp_path / "flag"))
    code_ref, listed = run(*common, "--reference", str(tmp_path / "reference.csv"), "--output", str(tmp_path / "ref"))
    assert code == code_ref == 0 and flag["ok"] == listed["ok"] == 3
    assert rows_of(tmp_path / "flag") == rows_of(tmp_path / "ref")
