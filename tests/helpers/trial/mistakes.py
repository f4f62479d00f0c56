"""The trial's operator mistakes: two runs into one folder, an `--output` that is an input or an empty
string, a folder of the user's own files, a copied shard, another model or command into a finished folder,
an `--overwrite` where the user's files or another command's run lie. Each is refused in one line, changing
nothing, or survived with nothing mixed."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

from helpers.trial.cases import (
    CLEAR_LINE,
    CORPUS_LINES,
    KILL_LINES,
    MISTAKE,
    REFUSED_LINE,
    Cases,
    M,
    R,
    corpus,
    distinct_texts,
    masked,
    nbest,
    rescore_argv,
    score_argv,
    write,
)
from helpers.trial.dscore import TIMEOUT_S
from helpers.trial.judge import Outcome, Trial, markers, snapshot, verdict

CASES = Cases(MISTAKE)
case = CASES.add


@case(
    "O01",
    "two rescore runs into one folder at once",
    "the second refused in one line, changing nothing; the first exit 0, its texts its own, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    first_argv = rescore_argv(d, 6, 2, out="R", name="a")
    second_argv = rescore_argv(d, 5, 3, out="R", name="b")
    first = t.dscore.start(first_argv, d)
    while markers(d / "R" / "mlm") < 1 and first.poll() is None:
        time.sleep(0.02)
    held = first.poll() is None
    texts = snapshot(d / "R" / "texts")
    second = t.call(d, *second_argv)
    texts_after = snapshot(d / "R" / "texts")
    done = first.wait(TIMEOUT_S)
    rows_in = distinct_texts(d, "a_dev.jsonl", "a_test.jsonl")
    o = t.observe(second, d, "R", rows_in, "the second started while the first held R", rows_dir="R/mlm")
    t.one_line(o, second, 2, ["R"])
    o.check(held, "the first run ended before the second started")
    o.check(texts == texts_after, "the second run changed R/texts")
    o.check(done.rc == 0, f"the first run ended with exit {done.rc}: {done.line}")
    o.check(o.rows_out == rows_in and o.duplicates == 0, f"R/mlm holds {o.rows_out} rows, {o.duplicates} repeated")
    o.check(o.verdict == "OK", f"verify says {o.verdict}")
    o.check(_texts_are(d / "R" / "mlm", d, ["a_dev.jsonl", "a_test.jsonl"]), "R/mlm holds texts not of run A")
    return o


def _texts_are(folder: Path, d: Path, sources: Sequence[str]) -> bool:
    import pyarrow.parquet as pq

    wanted = {json.loads(line)["text"] for s in sources for line in (d / s).read_text().splitlines()}
    got = {
        text
        for m in (folder / "_done").glob("*.json")
        for text in pq.read_table(folder / "rows" / f"part-{m.stem}.parquet", columns=["text"], use_threads=False)
        .column("text")
        .to_pylist()
    }
    return got <= wanted


@case(
    "O02",
    "--output = an input folder: `score o/x --output o/x`",
    f"{REFUSED_LINE} into o/x",
)
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *score_argv(corpus(d), out="o/x"))
    return t.refused(
        d,
        ["score", "o/x", "--model", M, "--output", "o/x"],
        ["o/x"],
        out="o/x",
        untouched=snapshot(d / "o/x"),
        rows_in=CORPUS_LINES,
    )


@case("O03", "the same with --overwrite", f"{REFUSED_LINE} into o/x")
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *score_argv(corpus(d), out="o/x"))
    return t.refused(
        d,
        ["score", "o/x", "--model", M, "--output", "o/x", "--overwrite"],
        ["o/x"],
        out="o/x",
        untouched=snapshot(d / "o/x"),
        rows_in=CORPUS_LINES,
    )


@case("O04", "--output inside the input folder", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="data/c.txt")
    return t.refused(d, ["score", "data", "--model", M, "--output", "data/out"], ["data"], out="data/out")


@case("O05", "an input inside the --output folder", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="out/c.txt")
    return t.refused(d, ["score", "out/c.txt", "--model", M, "--output", "out"], ["out"], untouched=snapshot(d / "out"))


def _users_folder(d: Path) -> dict[str, bytes]:
    write(d, "out/summary.json", '{"mine": true}\n')
    write(d, "out/report.html", "<p>my report</p>\n")
    write(d, "out/audit.json", "{}\n")
    return snapshot(d / "out")


@case(
    "O06",
    "audit into a folder of the user's own files (summary.json, report.html)",
    f"{REFUSED_LINE}: the user's files unchanged",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    return t.refused(d, ["audit", source, "--model", M, "--output", "out"], ["_run.json"], untouched=_users_folder(d))


@case(
    "O07",
    "score --overwrite into a folder of the user's own files",
    f"{REFUSED_LINE}: the user's files unchanged",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    return t.refused(
        d, ["score", source, "--model", M, "--output", "out", "--overwrite"], ["_run.json"], untouched=_users_folder(d)
    )


def _empty_output(command: str) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        if command == "rescore":
            argv = ["rescore", "--dev", nbest(d, "dev.jsonl"), "--test", nbest(d, "test.jsonl")]
        else:
            argv = [command, masked(d) if command in ("infill", "sample") else corpus(d)]
        before = snapshot(d)
        o = t.refused(d, [*argv, "--model", M, "--output", ""], ["--output is empty"], out=None)
        o.check(
            set(snapshot(d)) - set(before) <= {k for k in snapshot(d) if k.startswith("_logs")},
            "files were written into the current directory",
        )
        return o

    return run


for _id, _command in (("O08", "score"), ("O09", "audit"), ("O10", "infill"), ("O11", "rescore")):
    case(_id, f"{_command} --output ''", f"{REFUSED_LINE} in the current directory")(_empty_output(_command))


@case(
    "O12",
    "a copied shard in rows/, then the same command",
    "exit 0 warning of it; rows out (marked shards) == rows in, no repeated id; verify FAILED naming the file",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d))
    t.call(d, *argv)
    shutil.copy(d / "out" / "rows" / "part-00000-000000000000.parquet", d / "out" / "rows" / "copy.parquet")
    (d / "out" / "summary.json").unlink()
    call = t.call(d, *argv)
    o = t.observe(call, d, "out", CORPUS_LINES, "summary.json deleted so that the rerun reads the rows again")
    o.check(call.rc == 0 and not call.traceback, f"exit {call.rc}")
    o.check("copy.parquet" in call.err, "no warning names copy.parquet")
    o.check(o.rows_out == CORPUS_LINES and o.duplicates == 0, f"rows out {o.rows_out}, {o.duplicates} repeated")
    o.check(json.loads((d / "out" / "summary.json").read_text())["rows"] == CORPUS_LINES, "summary rows")
    o.check(o.verdict == "FAILED", f"verify says {o.verdict}")
    report = t.call(d, "verify", "out")
    o.check("copy.parquet" in report.out + report.err, "verify does not name copy.parquet")
    return o


@case(
    "O13",
    "--overwrite of a run folder holding the user's files in rows/ and _done/",
    "exit 0; the user's files kept; rows out == rows in; verify names the user's file in rows/ (FAILED)",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *score_argv(source))
    write(d, "out/rows/my-notes.txt", "keep me\n")
    write(d, "out/_done/my-notes.txt", "keep me too\n")
    call = t.call(d, *score_argv(source, "--overwrite", "--variant", "word_l2r"))
    o = t.observe(call, d, "out", CORPUS_LINES, "the second run with another --variant")
    o.check(call.rc == 0 and not call.traceback, f"exit {call.rc}")
    o.check(
        (d / "out/rows/my-notes.txt").exists() and (d / "out/_done/my-notes.txt").exists(),
        "the user's files were deleted",
    )
    o.check(o.rows_out == CORPUS_LINES and o.duplicates == 0, f"rows out {o.rows_out}, {o.duplicates} repeated")
    o.check(o.verdict == "FAILED", f"verify says {o.verdict}")
    return o


@case(
    "O14",
    "score --overwrite into an audit's folder",
    "exit 0; the audit's audit.json and report.html gone; rows in == rows out; verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, "audit", source, "--model", M, "--output", "out", "--shard-rows", "4")
    had = (d / "out/audit.json").exists() and (d / "out/report.html").exists()
    o = t.rows_ok(d, score_argv(source, "--overwrite"), CORPUS_LINES, done="after an audit into out")
    o.check(had, "the audit wrote no audit.json/report.html")
    o.check(not (d / "out/audit.json").exists() and not (d / "out/report.html").exists(), "the audit's reports stayed")
    return o


@case("O15", "score into a training folder (made by train's own claim)", f"{REFUSED_LINE}, the folder unchanged")
def _(t: Trial, d: Path) -> Outcome:
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.io.claim import claim_training
    from distributed_scoring.workflows.train.run import TRAINING_OUTPUTS, TrainOptions, training_fingerprint

    run = training_fingerprint("maskless", ModelSpec(M), TrainOptions(), {"teacher": "t"})
    with claim_training(str(d / "trained"), run, outputs=TRAINING_OUTPUTS):
        write(d, "trained/checkpoints/step-00000010/weights.bin", b"\x00" * 16)
    return t.refused(
        d, score_argv(corpus(d), out="trained"), ["trained"], out="trained", untouched=snapshot(d / "trained")
    )


@case("O16", "a finished score folder rerun with another model", f"{REFUSED_LINE}, the folder unchanged")
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *score_argv(source))
    return t.refused(
        d,
        ["score", source, "--model", R, "--output", "out", "--shard-rows", "2"],
        ["--overwrite"],
        rows_in=CORPUS_LINES,
        untouched=snapshot(d / "out"),
    )


@case("O17", "the same with --overwrite", "exit 0, only the new model's rows, verify OK")
def _(t: Trial, d: Path) -> Outcome:
    import pyarrow.parquet as pq

    source = corpus(d)
    t.call(d, *score_argv(source))
    o = t.rows_ok(
        d, ["score", source, "--model", R, "--output", "out", "--shard-rows", "2", "--overwrite"], CORPUS_LINES
    )
    summary = json.loads((d / "out/summary.json").read_text())
    o.check(summary["model"] == R, f"summary names model {summary['model']}")
    o.check(len(list((d / "out/rows").glob("*.parquet"))) == 6, "shard files of the first run remain")
    o.check(pq.read_table(d / "out/rows").num_rows == CORPUS_LINES, "rows/ reads as more rows than the run's")
    return o


@case("O18", "a finished score folder rerun with another --shard-rows", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *score_argv(source))
    return t.clear(d, ["score", source, "--model", M, "--output", "out", "--shard-rows", "3"], CORPUS_LINES)


@case(
    "O19",
    "two score runs into one folder at once",
    "the second refused in one line naming the holder; the first exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    lines = 8 * KILL_LINES  # long enough that the first still runs when the second has checked its model
    argv = score_argv(corpus(d, lines))
    first = t.dscore.start(argv, d)
    while markers(d / "out") < 1 and first.poll() is None:
        time.sleep(0.02)
    held = first.poll() is None
    second = t.call(d, *argv)
    still = first.poll() is None
    done = first.wait(TIMEOUT_S)
    o = t.observe(second, d, "out", lines, "the second started while the first held out/")
    t.one_line(o, second, 2, ["in use by another run"])
    o.check(held and still, "the first run ended before the second had finished")
    return t.complete(o, done)


@case("O20", "a finished run rerun unchanged", "exit 0, nothing rescored (files unchanged), verify OK")
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d))
    t.call(d, *argv)
    rows = snapshot(d / "out" / "rows")
    o = t.rows_ok(d, argv, CORPUS_LINES)
    o.check(snapshot(d / "out" / "rows") == rows, "shard files rewritten")
    return o


@case("O21", "verify a folder of the user's own files", "exit 2 `not a run`, one line")
def _(t: Trial, d: Path) -> Outcome:
    _users_folder(d)
    call = t.call(d, "verify", "out")
    o = Outcome(command=call.shown, rc=call.rc, line=call.line, traceback=call.traceback, verdict=verdict(call))
    o.check(call.rc == 2 and not call.traceback, f"exit {call.rc}")
    o.check(len((call.out + call.err).strip().splitlines()) == 1, "not one line")
    return o


@case("O22", "verify a folder that does not exist", "exit 2, one line")
def _(t: Trial, d: Path) -> Outcome:
    call = t.call(d, "verify", "nowhere")
    o = Outcome(command=call.shown, rc=call.rc, line=call.line, traceback=call.traceback, verdict=verdict(call))
    o.check(call.rc == 2 and not call.traceback, f"exit {call.rc}")
    o.check(len((call.out + call.err).strip().splitlines()) == 1, "not one line")
    return o


@case("O23", "--output = the model's folder, with --overwrite", f"{REFUSED_LINE}, the model unchanged")
def _(t: Trial, d: Path) -> Outcome:
    shutil.copytree(d.parent / "_models" / "bert", d / "model")
    return t.refused(
        d,
        ["score", corpus(d), "--model", "model", "--output", "model", "--overwrite"],
        ["model"],
        out="model",
        untouched=snapshot(d / "model"),
    )


@case("O24", "infill into a finished score folder", f"{REFUSED_LINE}, the folder unchanged")
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *score_argv(corpus(d)))
    return t.refused(
        d,
        ["infill", masked(d), "--id-column", "id", "--model", M, "--output", "out"],
        ["--overwrite"],
        rows_in=CORPUS_LINES,
        untouched=snapshot(d / "out"),
    )


@case("O25", "audit --baseline pointing at a score run's summary.json, not an audit.json", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *score_argv(source, out="scored"))
    return t.refused(
        d,
        ["audit", source, "--model", M, "--output", "out", "--baseline", "scored/summary.json"],
        ["scored/summary.json"],
    )
