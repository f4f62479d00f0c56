"""`dscore variants --windows proteingym`: a wild type longer than the model read as ProteinGym's ESM script
reads it under masked-marginals (`proteingym/baselines/esm/compute_fitness.py`, `get_optimal_window` of its
`utils/scoring_utils.py`), against a float64 reference written here from that script: the whole token list
(specials included) with one position masked, sliced by ProteinGym's rule, one masked copy per forward pass.
The rule itself is checked against the same transcription on every position of several lengths and widths."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from distributed_scoring.cli import main
from distributed_scoring.config import ModelSpec
from distributed_scoring.engine.masked_lm import load_masked_lm
from distributed_scoring.engine.windows import proteingym_window

from helpers import tiny
from helpers.cli import refusal
from helpers.reference import NaiveVariants

WILD = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"  # 30 residues: shorter than the tiny models' window
TOLERANCE = 1e-5  # float32 run against the float64 reference
MODEL_WINDOW = 1024  # compute_fitness.py's model_window, for every ESM model


def optimal_window(mutation_position_relative: int, seq_len_wo_special: int, model_window: int) -> list[int]:
    """ProteinGym's `get_optimal_window`, as its scoring_utils.py writes it (its names kept)."""
    half_model_window = model_window // 2
    if seq_len_wo_special <= model_window:
        return [0, seq_len_wo_special]
    elif mutation_position_relative < half_model_window:
        return [0, model_window]
    elif mutation_position_relative >= seq_len_wo_special - half_model_window:
        return [seq_len_wo_special - model_window, seq_len_wo_special]
    else:
        return [
            max(0, mutation_position_relative - half_model_window),
            min(seq_len_wo_special, mutation_position_relative + half_model_window),
        ]


@pytest.mark.parametrize("width", [7, 8, 96, 1024])
def test_the_rule_is_proteingyms_at_every_position(width):
    for length in (width - 1, width, width + 1, width + 2, 2 * width + 3, 3 * width):
        for position in range(length):
            assert list(proteingym_window(position, length, width)) == optimal_window(position, length, width)


def proteingym_masked_marginal(reference: NaiveVariants, wild: str, mutant: str, width: int = MODEL_WINDOW) -> float:
    """compute_fitness.py's masked-marginals score of `mutant`: for each site, the wild type's tokens with the
    site's token masked, sliced to the window of that token when the tokens are more than `width`, one forward
    pass alone, log-softmax read at the token's place in the slice; then label_row's sum of log p(mt) - log p(wt)
    over the sites."""
    ids, positions = reference.encode(wild)
    score = 0.0
    for part in mutant.split(":"):
        wt, i, mt = part[0], int(part[1:-1]) - 1, part[-1]
        token = positions[i]  # 1 + i: ProteinGym's "add 1 for BOS"
        masked = list(ids)
        masked[token] = reference.tokenizer.mask_token_id
        start, end = optimal_window(token, len(ids), width) if len(ids) > width else (0, len(ids))
        logp = reference.logprobs(masked[start:end])[token - start].numpy()
        score += float(logp[reference.residue_id(mt)] - logp[reference.residue_id(wt)])
    return score


def run(*args: str) -> dict:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert main(list(args)) == 0
    return json.loads(buffer.getvalue())


def scores(folder: Path) -> dict[str, float]:
    return {r["mutant"]: r["score"] for r in pq.read_table(folder / "variants.parquet").to_pylist()}


def write_table(path: Path, mutants: list[str]) -> Path:
    path.write_text("mutant\n" + "\n".join(mutants) + "\n")
    return path


def long_mutants(wild: str, width: int) -> list[str]:
    """Sites in each of the rule's cases and on their edges (0-based token t = residue + 1, n tokens): the first
    window (t < width // 2), the last (t >= n - width // 2), the middle ones between (no special token in them),
    and multiple mutants whose sites are read in different windows."""
    half, n = width // 2, len(wild) + 2
    residues = sorted({0, half - 2, half - 1, half, 60, n - half - 2, n - half - 1, len(wild) - 1})
    singles = [f"{wild[i]}{i + 1}{'A' if wild[i] != 'A' else 'G'}" for i in residues]
    return [*singles, f"{singles[0]}:{singles[4]}", f"{singles[3]}:{singles[-1]}"]


@pytest.mark.parametrize("family", ["bert", "esm"])
def test_a_long_wild_type_scores_as_proteingyms_script(tmp_path, tiny_protein_dir, family):
    model = tiny_protein_dir(family)
    exact = load_masked_lm(ModelSpec(str(model), dtype="float64"))
    width = exact.max_length
    wild = (WILD * 6)[: width + 40]  # width + 42 tokens with the specials
    mutants = long_mutants(wild, width)
    table = write_table(tmp_path / "long.csv", mutants)
    common = ("variants", str(table), "--model", str(model), "--target-seq", wild, "--strategy", "masked-marginal")
    summary = run(*common, "--windows", "proteingym", "--output", str(tmp_path / "pg"))
    run(*common, "--output", str(tmp_path / "centred"))
    assert summary["ok"] == len(mutants) and summary["forward_passes"] == len(mutants) - 2  # a masked copy a site
    reference = NaiveVariants(exact.model, exact.tokenizer)
    got, centred = scores(tmp_path / "pg"), scores(tmp_path / "centred")
    for mutant in mutants:
        want = proteingym_masked_marginal(reference, wild, mutant, width)
        assert abs(got[mutant] - want) <= TOLERANCE * max(1.0, abs(want)), (mutant, got[mutant], want)
    assert max(abs(got[m] - centred[m]) for m in mutants) > 1e-3  # the middle windows lack the specials


def test_esm2_stating_1026_positions_is_windowed_at_proteingyms_1024(tmp_path):
    """ESM-2's configuration states 1026 positions, so dscore's own windows read 1026 tokens whole; ProteinGym
    slices every ESM model's tokens past 1024. A tiny ESM-2 stating 1026 (rotary: no table to size) and a wild
    type of 1024 residues: sites in the first window, the last, and the two middle ones (one without specials)."""
    tokenizer = tiny.make_protein_tokenizer("esm")
    tokenizer.model_max_length = 1026
    model = tiny.make_protein_model("esm", tokenizer)
    model.config.max_position_embeddings = 1026
    model.save_pretrained(tmp_path / "esm2")
    tokenizer.save_pretrained(tmp_path / "esm2")
    wild = (WILD * 35)[:1024]
    mutants = [f"{wild[i]}{i + 1}{'A' if wild[i] != 'A' else 'G'}" for i in (0, 511, 512, 1023)]
    table = write_table(tmp_path / "long.csv", [*mutants, ":".join(mutants)])
    summary = run(
        "variants", str(table), "--model", str(tmp_path / "esm2"), "--target-seq", wild,
        "--strategy", "masked-marginal", "--windows", "proteingym", "--output", str(tmp_path / "pg"),
    )  # fmt: skip
    assert summary["ok"] == 5 and summary["forward_passes"] == 4
    exact = load_masked_lm(ModelSpec(str(tmp_path / "esm2"), dtype="float64"))
    assert exact.max_length == 1026
    reference = NaiveVariants(exact.model, exact.tokenizer)
    for mutant, got in scores(tmp_path / "pg").items():
        want = proteingym_masked_marginal(reference, wild, mutant)
        assert abs(got - want) <= TOLERANCE * max(1.0, abs(want)), (mutant, got, want)


def test_a_short_wild_type_scores_the_same_and_the_option_is_recorded_only_when_set(tmp_path, tiny_protein_dir, capsys):
    model = str(tiny_protein_dir("esm"))
    table = write_table(tmp_path / "short.csv", ["M1A", "K2R:T3S", "I30V"])
    common = ("variants", str(table), "--model", model, "--target-seq", WILD, "--strategy", "masked-marginal")
    run(*common, "--output", str(tmp_path / "centred"))
    run(*common, "--windows", "proteingym", "--output", str(tmp_path / "pg"))
    assert scores(tmp_path / "pg") == scores(tmp_path / "centred")
    for run_json in ("_run.json", "sites/_run.json"):  # the command's and its site run's: earlier folders resume
        assert '"windows"' not in (tmp_path / "centred" / run_json).read_text()
        assert '"windows": "proteingym"' in (tmp_path / "pg" / run_json).read_text()
    again = refusal(capsys, [*common, "--windows", "proteingym", "--output", str(tmp_path / "centred")])
    assert "differs in: windows" in again, again
    wrong = refusal(capsys, [*common[:-1], "wt-marginal", "--windows", "proteingym", "--output", str(tmp_path / "w")])
    assert "--windows proteingym applies to --strategy masked-marginal only" in wrong, wrong
