"""`dscore rescore` on toolkits' N-best lists: the same lists as JSONL and as fairseq, Marian, NeMo, Kaldi or
ESPnet2 write them rescore alike (same weights, same dev/test figures, same test.best.txt), and the test
list comes back rescored in its own format; --format names are checked before any scoring."""

from __future__ import annotations

import json

import pytest

from distributed_scoring.cli import main
from distributed_scoring.io.nbest import read_nbest
from distributed_scoring.io.nbest_formats import FormatOptions

from helpers import nbest_samples as S
from helpers import rescoring as H

FIGURES = ("lambda", "gamma", "mlm_alpha")


def numbered(records: list[dict]) -> list[dict]:
    """The records with utterance ids "0", "1", ... (what fairseq, Marian and NeMo number them)."""
    ids = {u: str(i) for i, u in enumerate(dict.fromkeys(r["utt_id"] for r in records))}
    return [{**r, "utt_id": ids[r["utt_id"]]} for r in records]


SPLITS = {
    split: numbered(H.synthetic_nbest(4, 3, seed=seed, prefix=split)[0]) for split, seed in (("dev", 1), ("test", 2))
}


def written_as(fmt: str, folder, split: str) -> tuple[list[str], str]:
    """`--dev`/`--test` (and refs) arguments for SPLITS[split] written as `fmt`, and the list's path."""
    records, base = SPLITS[split], folder / split
    refs = ["--" + split + "-refs", S.write_refs(folder / f"{split}.refs.txt", records)]
    if fmt == "jsonl":
        path, refs = S.write_jsonl(folder / f"{split}.jsonl", records), []
    elif fmt == "fairseq":
        path, refs = S.write_fairseq(folder / f"{split}.generate.txt", records, order=["2", "0", "3", "1"]), []
    elif fmt == "marian":
        path = S.write_moses(folder / f"{split}.nbest", records, "F0= {s}")
    elif fmt == "nemo":
        path = S.write_nemo(folder / f"{split}.beams.tsv", records, beam=3)
    elif fmt == "kaldi":
        path = S.write_kaldi(base, records, acwt=0.1)
        refs[1] = S.write_refs(folder / f"{split}.text", records, kaldi_style=True)
    else:
        path = S.write_espnet2(base, records)
        refs[1] = S.write_refs(folder / f"{split}.text", records, kaldi_style=True)
    return [f"--{split}", path, *refs], path


def rescore(tmp_path, tiny_model_dir, fmt: str, *extra: str) -> tuple[dict, str, object]:
    """report.json, test.best.txt and the output folder of `dscore rescore` on SPLITS written as `fmt`."""
    args = [*written_as(fmt, tmp_path, "dev")[0], *written_as(fmt, tmp_path, "test")[0]]
    out = tmp_path / f"out-{fmt}"
    assert main(["rescore", *args, "--model", str(tiny_model_dir("bert")), "--output", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text()), (out / "test.best.txt").read_text(), out


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory, tiny_model_dir):
    return rescore(tmp_path_factory.mktemp("jsonl"), tiny_model_dir, "jsonl")


@pytest.mark.parametrize(
    "fmt, extra, rescored",
    [
        ("fairseq", [], "test.rescored.txt"),
        ("marian", ["--format", "marian"], "test.rescored.nbest"),
        ("nemo", [], "test.rescored.tsv"),  # beams of 3 told from the 4 references of 12 candidates
        ("kaldi", ["--kaldi-acwt", "0.1"], "test.rescored/lm_cost"),
        ("espnet", [], "test.rescored/1best_recog/text"),
    ],
)
def test_a_toolkit_list_rescores_like_its_jsonl(tmp_path, tiny_model_dir, jsonl_run, fmt, extra, rescored):
    expected_report, expected_best, _ = jsonl_run
    report, best, out = rescore(tmp_path, tiny_model_dir, fmt, *extra)
    assert {k: report[k] for k in FIGURES} == {k: expected_report[k] for k in FIGURES}
    for split in ("dev", "test"):
        for figure in ("baseline", "rescored", "oracle", "utterances", "hypotheses", "changed"):
            assert report[split][figure] == pytest.approx(expected_report[split][figure]), (split, figure)
    assert best == expected_best and len(best.splitlines()) == 4
    assert (out / rescored).is_file()
    # fairseq's and Marian's readers put utterances in numeric id order, and report.md says so.
    order = "numeric id order" if fmt in ("fairseq", "marian") else "order of first appearance"
    assert f"one line per utterance, utterances in {order}" in (out / "report.md").read_text()
    # The rescored list reads back in its format with the 1-best of test.best.txt first (Kaldi: lowest cost).
    back_path = str(out / rescored.split("/")[0])
    back = read_nbest(back_path, fmt=fmt, options=FormatOptions(kaldi_acwt=0.1, beam_size=3)).to_pylist()
    firsts = [max((r for r in back if r["utt_id"] == u), key=lambda r: r["score"])["text"] for u in "0123"]
    assert firsts == best.splitlines()


def test_format_names_are_checked_before_any_scoring(tmp_path, tiny_model_dir, capsys):
    args, _ = written_as("jsonl", tmp_path, "dev")
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(
            ["rescore", *args, "--test", args[1], "--format", "kaldi1", "--model", "m", "--output", str(tmp_path / "o")]
        )
    assert info.value.code == 2 and "invalid choice: 'kaldi1'" in capsys.readouterr().err
    model = str(tiny_model_dir("bert"))
    capsys.readouterr()
    rc = main(
        ["rescore", *args, "--test", args[1], "--format", "fairseq", "--model", model, "--output", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "no `H-` lines" in err
    assert not (tmp_path / "o").exists()


def test_format_options_enter_the_fingerprint_only_when_set():
    """A folder of an earlier dscore (no format options then) resumes: at their defaults they are left out."""
    from distributed_scoring.workflows.rescore.run import RescoreInputs, _fingerprint

    plain = _fingerprint(RescoreInputs("d.json", "t.json", "out"), None, None, "pll")
    assert not {"fmt", "kaldi_acwt", "beam_size"} & set(plain)
    kaldi = _fingerprint(RescoreInputs("d", "t", "out", fmt="kaldi", kaldi_acwt=0.1), None, None, "pll")
    assert kaldi["fmt"] == "kaldi" and kaldi["kaldi_acwt"] == 0.1 and "beam_size" not in kaldi


def test_rescore_inputs_check_the_format_name():
    from distributed_scoring.errors import UserError
    from distributed_scoring.workflows.rescore.run import RescoreInputs

    with pytest.raises(UserError, match=r"--format 'fairseq-py' is not one of auto, jsonl, parquet, fairseq"):
        RescoreInputs("d", "t", "out", fmt="fairseq-py")
