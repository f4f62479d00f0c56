"""The trial's attacks: path traversal and control characters in ids, HTML in what the audit report
shows, a model that brings its own code, symlinks from the output to the input, shell and format strings.
Nothing is written outside the output folder, nothing runs, the input never changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from helpers import tiny
from helpers.trial.cases import (
    ATTACK,
    CLEAR_LINE,
    REFUSED_LINE,
    Cases,
    M,
    corpus,
    jsonl,
)
from helpers.trial.judge import Outcome, Trial, snapshot

CASES = Cases(ATTACK)
case = CASES.add


@case(
    "A01",
    "path traversal in ids (../../escape, /etc/passwd, ..\\..\\x, rows/../../y)",
    "exit 0, rows in == rows out, no file written outside out/, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    ids = ["../../escape", "/etc/passwd", "..\\..\\x", "rows/../../y"]
    source = jsonl(d, "p.jsonl", [{"id": i, "text": "a dog"} for i in ids])
    before = {p for p in d.parent.rglob("*") if "_logs" not in p.parts}
    o = t.rows_ok(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], len(ids))
    outside = [
        str(p)
        for p in d.parent.rglob("*")
        if p not in before and "_logs" not in p.parts and not p.is_relative_to(d / "out")
    ]
    o.check(not outside, f"written outside out/: {outside[:3]}")
    return o


@case("A02", "ids with a newline, a NUL, ANSI escapes and 10,000 characters", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    ids = ["a\nb", "c\x00d", "\x1b[31mred\x1b[0m", "x" * 10000]
    source = jsonl(d, "p.jsonl", [{"id": i, "text": "a dog"} for i in ids])
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], len(ids))


HTML = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _html(where: str) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        records = [
            {
                "id": (HTML + str(i)) if where == "ids" else f"r{i}",
                "text": tiny.CORPUS[i % 14] if where != "text" or i else HTML,
                "source": HTML if where == "partitions" and i % 2 else "plain",
            }
            for i in range(12)
        ]
        o = t.rows_ok(
            d,
            [
                "audit",
                jsonl(d, "h.jsonl", records),
                "--id-column",
                "id",
                "--partition-column",
                "source",
                "--model",
                M,
                "--output",
                "out",
                "--outlier-min-sigma",
                "0.0001",
            ],
            12,
        )
        report = (d / "out" / "report.html").read_text() if (d / "out" / "report.html").exists() else ""
        o.check(bool(report), "no report.html")
        o.check("<script>alert" not in report and "<img src=x" not in report, "report.html holds the raw HTML")
        return o

    return run


case(
    "A03",
    "HTML in partition names (audit report.html)",
    "exit 0, rows in == rows out, verify OK; report.html escapes it",
)(_html("partitions"))
case(
    "A04",
    "HTML in ids (audit's outliers in report.html)",
    "exit 0, rows in == rows out, verify OK; report.html escapes it",
)(_html("ids"))
case(
    "A05",
    "HTML as a text (audit's outliers in report.html)",
    "exit 0, rows in == rows out, verify OK; report.html escapes it",
)(_html("text"))


def _remote_code(where: str) -> Callable[[Trial, Path], Outcome]:
    """A model folder (tests/faults/test_diagnoses.py's) whose config or tokenizer names a class defined in a
    Python file beside it; the file, if run, leaves `pwned` behind."""

    def run(t: Trial, d: Path) -> Outcome:
        folder = d / "custom-model"
        shutil.copytree(d.parent / "_models" / "bert", folder)
        payload = f"open({str(d / 'pwned')!r}, 'w').write('ran')\n"
        if where == "config":
            (folder / "custom.py").write_text(
                payload + "from transformers import BertConfig\n\n\n"
                "class CustomConfig(BertConfig):\n    model_type = 'custom-bert'\n"
            )
            config = json.loads((folder / "config.json").read_text())
            config.update(model_type="custom-bert", auto_map={"AutoConfig": "custom.CustomConfig"})
            (folder / "config.json").write_text(json.dumps(config))
        else:
            (folder / "custom_tok.py").write_text(
                payload + "from transformers import BertTokenizer\n\n\n"
                "class CustomTokenizer(BertTokenizer):\n    pass\n"
            )
            config = json.loads((folder / "tokenizer_config.json").read_text())
            config.update(
                tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": ["custom_tok.CustomTokenizer", None]}
            )
            (folder / "tokenizer_config.json").write_text(json.dumps(config))
        argv = ["score", corpus(d, 3), "--model", "custom-model", "--output", "out"]
        # A config naming its own class cannot be loaded without the code; a tokenizer's files may still load
        # as a built-in class. Either way the code never runs (docs/runs.md, Models).
        o = t.refused(d, argv, ["--trust-remote-code"]) if where == "config" else t.clear(d, argv, 3)
        o.check(not (d / "pwned").exists(), "the model's code ran")
        return o

    return run


case(
    "A06",
    "a model whose config needs its own code (auto_map)",
    f"{REFUSED_LINE}, naming --trust-remote-code; the code never runs",
)(_remote_code("config"))
case("A07", "a model whose tokenizer needs its own code (auto_map)", f"the code never runs: {CLEAR_LINE}")(
    _remote_code("tokenizer")
)


@case("A08", "--output a symlink to the input folder", f"{REFUSED_LINE}, the input unchanged")
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="data/c.txt")
    (d / "out").symlink_to(d / "data", target_is_directory=True)
    return t.refused(
        d, ["score", "data/c.txt", "--model", M, "--output", "out"], ["out"], untouched=snapshot(d / "data"), out="data"
    )


@case("A09", "--output a symlink to the input file, with --overwrite", f"{REFUSED_LINE}, the input unchanged")
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    (d / "out").symlink_to(d / source)
    before = (d / source).read_bytes()
    o = t.refused(d, ["score", source, "--model", M, "--output", "out", "--overwrite"], ["out"], out=None)
    o.check((d / source).exists() and (d / source).read_bytes() == before, "the input changed")
    return o


@case(
    "A10",
    "a run folder whose rows/ is a symlink to the input folder, --overwrite",
    f"{REFUSED_LINE}, the input unchanged",
)
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="data/c.txt")
    (d / "out").mkdir()
    (d / "out" / "rows").symlink_to(d / "data", target_is_directory=True)
    return t.refused(
        d,
        ["score", "data/c.txt", "--model", M, "--output", "out", "--overwrite"],
        [],
        untouched=snapshot(d / "data"),
        out="data",
    )


@case(
    "A11",
    "shell and format strings as ids and texts ($(touch pwned), %s%n, {0.__class__})",
    "exit 0, rows in == rows out, verify OK, nothing run",
)
def _(t: Trial, d: Path) -> Outcome:
    values = ["$(touch pwned)", "`touch pwned`", "%s%n%x", "{0.__class__}", "'; DROP TABLE rows; --"]
    source = jsonl(d, "s.jsonl", [{"id": v, "text": v} for v in values])
    o = t.rows_ok(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], len(values))
    o.check(not (d / "pwned").exists(), "a shell ran")
    return o
