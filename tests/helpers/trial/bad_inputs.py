"""The trial's bad inputs: every file of tests/data/bad, empty, odd and mistyped inputs, flags out of
bounds, repeated ids, broken N-best lists, through `score`, `audit`, `sample`, `infill` and `rescore`. Each
is a clear one-line error before any work (exit 2, no traceback, nothing written) or an error row per bad
row (rows in == rows out, verify OK)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Sequence

from helpers.trial.cases import (
    BAD_INPUT,
    CLEAR_LINE,
    MASKED,
    REFUSED_LINE,
    ROWS_LINE,
    Cases,
    M,
    corpus,
    jsonl,
    masked,
    nbest,
    parquet,
    write,
)
from helpers.trial.judge import Outcome, Trial

CASES = Cases(BAD_INPUT)
BAD = Path(__file__).resolve().parents[2] / "data" / "bad"
case = CASES.add

# tests/data/bad: file -> words of its one-line refusal, or (records, error rows) read with --id-column id
BAD_FILES: dict[str, str | tuple[int, int]] = {
    "binary.dat": "is not a text file",
    "cr_only.txt": "CR-only",
    "garbage.parquet": "not a readable Parquet file",
    "lone_surrogate.jsonl": (5, 2),
    "not_gzip.txt.gz": "incorrect header check",
    "stray_quote.csv": (5, 1),
    "truncated.jsonl.bz2": "damaged or truncated",
    "truncated.parquet": "not a readable Parquet file",
    "truncated.txt.gz": "damaged or truncated",
    "unterminated_quote.csv": "never closed",
    "utf16_bom.txt": "is UTF-16 text",
}


def _bad_file(name: str) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        shutil.copy(BAD / name, d / name)
        expected = BAD_FILES.get(name)
        if isinstance(expected, tuple):
            return t.rows_ok(
                d,
                ["score", name, "--id-column", "id", "--model", M, "--output", "out"],
                rows_in=expected[0],
                errors=expected[1],
            )
        o = t.refused(d, ["score", name, "--model", M, "--output", "out"], [name, expected or ""])
        o.check(expected is not None, f"{name} is not in the trial's table: add it to BAD_FILES")
        return o

    return run


for _i, _path in enumerate(sorted(BAD.iterdir()), start=1):
    _expected = BAD_FILES.get(_path.name)
    case(
        f"B{_i:02d}",
        f"score tests/data/bad/{_path.name}",
        f"{ROWS_LINE} ({_expected[0]} rows, {_expected[1]} errors)"
        if isinstance(_expected, tuple)
        else f"{REFUSED_LINE}: '{_expected}'",
    )(_bad_file(_path.name))


@case("B20", "score an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["score", write(d, "empty.txt", ""), "--model", M, "--output", "out"], rows_in=0)


@case("B21", "score an empty directory", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    (d / "data").mkdir()
    return t.refused(d, ["score", "data", "--model", M, "--output", "out"], ["data"])


@case("B22", "score a directory of hidden and _-prefixed files only (_meta.json, .hidden)", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    write(d, "data/_meta.json", "{}\n")
    write(d, "data/.hidden", "x\n")
    return t.refused(d, ["score", "data", "--model", M, "--output", "out"], ["data"])


@case("B23", "score a CSV without the text column", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(d, ["score", write(d, "t.csv", "id,sentence\n1,a b\n"), "--model", M, "--output", "out"], ["text"])


@case("B24", "score JSONL with a null text among 3", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "n.jsonl", [{"text": "a dog"}, {"text": None}, {"text": "the fox"}])
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B25", "score JSONL whose 2nd record lacks the text field", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "n.jsonl", [{"text": "a dog"}, {"other": "x"}, {"text": "the fox"}])
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B26", "score a 300,000-character line between two short ones", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "long.txt", "a dog\n" + "word " * 60000 + "\nthe fox\n")
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B27", "score blank and whitespace-only lines", f"{ROWS_LINE} (5 rows, 3 errors)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "blank.txt", "a dog\n\n   \n\t\nthe fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=5, errors=3)


@case("B28", 'score JSONL with ids 1 and "1"', f"{REFUSED_LINE}, naming the ids and lines")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "i.jsonl", [{"id": 1, "text": "a dog"}, {"id": "1", "text": "the fox"}])
    return t.refused(
        d,
        ["score", source, "--id-column", "id", "--model", M, "--output", "out"],
        ["'1' at i.jsonl line 1 and i.jsonl line 2", "--allow-duplicate-ids"],
    )


@case("B29", "score Parquet with ids [1, 2, 2]", f"{REFUSED_LINE}, naming the ids and rows")
def _(t: Trial, d: Path) -> Outcome:
    source = parquet(d, "p.parquet", {"id": [1, 2, 2], "text": ["a dog", "the fox", "a cat"]})
    return t.refused(
        d,
        ["score", source, "--id-column", "id", "--model", M, "--output", "out"],
        ["'2' at p.parquet row 2 and p.parquet row 3"],
    )


@case("B30", "score a text file with one Latin-1 (not UTF-8) line", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "latin.txt", "a dog\n".encode() + "caf\xe9 cr\xe8me\n".encode("latin-1") + b"the fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B31", 'score JSONL lines that are not objects ([1,2], "s", 42, null)', f"{ROWS_LINE} (5 rows, 4 errors)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "o.jsonl", '{"text": "a dog"}\n[1, 2]\n"s"\n42\nnull\n')
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=5, errors=4)


@case("B32", "score JSONL with a malformed line", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "m.jsonl", '{"text": "a dog"}\n{"text": "the f\n{"text": "a cat"}\n')
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B33", "score a CSV row with extra fields", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "r.csv", "id,text\n1,a dog\n2,the fox,extra,more\n3,a cat\n")
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], rows_in=3)


@case("B34", "score a file that does not exist", f"{REFUSED_LINE}, naming it")
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(d, ["score", "missing.txt", "--model", M, "--output", "out"], ["missing.txt"])


@case("B35", "score a spreadsheet (.xlsx: a zip archive)", f"{REFUSED_LINE}: 'is not a text file'")
def _(t: Trial, d: Path) -> Outcome:
    import zipfile

    with zipfile.ZipFile(d / "sheet.xlsx", "w") as z:  # what a spreadsheet is: any suffix is read as text lines
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/worksheets/sheet1.xml", "<worksheet><sheetData/></worksheet>")
    return t.refused(d, ["score", "sheet.xlsx", "--model", M, "--output", "out"], ["sheet.xlsx is not a text file"])


@case("B36", "score a line holding a NUL byte", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(
        d, ["score", write(d, "nul.txt", b"a dog\nthe\x00fox\na cat\n"), "--model", M, "--output", "out"], rows_in=3
    )


@case("B37", "score JSONL with --text-column naming no field", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "t.jsonl", [{"text": "a dog"}])
    return t.refused(d, ["score", source, "--text-column", "sentence", "--model", M, "--output", "out"], ["sentence"])


@case("B38", "score JSONL with --id-column naming no field", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "t.jsonl", [{"text": "a dog"}])
    return t.refused(d, ["score", source, "--id-column", "key", "--model", M, "--output", "out"], ["key"])


@case("B39", "score Parquet with a null id", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = parquet(d, "p.parquet", {"id": ["a", None, "c"], "text": ["a dog", "the fox", "a cat"]})
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], rows_in=3)


@case("B40", "score a UTF-8 file with a byte-order mark", f"{ROWS_LINE} (2 rows, 0 errors)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "bom.txt", "\ufeffa dog\nthe fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=2, errors=0)


@case("B41", "score texts of special tokens only ([CLS] [SEP] [MASK], <s>)", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "s.txt", "[CLS] [SEP]\n[MASK] [MASK]\n<s></s>\n")
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B42", "score Parquet whose text column holds integers", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(
        d, ["score", parquet(d, "p.parquet", {"text": [1, 2, 3]}), "--model", M, "--output", "out"], rows_in=3
    )


FLAG_CASES = [  # id, command, flag, value, words
    ("B43", "score", "--shard-rows", "0", "--shard-rows 0 is out of bounds"),
    ("B44", "score", "--shard-rows", "-5", "--shard-rows -5 is out of bounds"),
    ("B45", "score", "--shard-rows", "abc", "--shard-rows"),
    ("B46", "score", "--stall-timeout", "-1", "--stall-timeout -1 is out of bounds"),
    ("B47", "score", "--stall-timeout", "nan", "--stall-timeout nan"),
    ("B48", "score", "--stall-timeout", "inf", "--stall-timeout inf"),
    ("B49", "score", "--batch-tokens", "0", "--batch-tokens 0"),
    ("B50", "score", "--num-actors", "0", "--num-actors 0"),
    ("B51", "score", "--cpus-per-actor", "0", "--cpus-per-actor 0"),
    ("B52", "sample", "--epochs", "1000000000", "lower --epochs"),
    ("B53", "sample", "--chains", "100000000", "--chains"),
    ("B54", "sample", "--epochs", "-1", "--epochs -1"),
    ("B55", "infill", "--beam", "0", "--beam 0"),
    ("B56", "score --method chain", "--orders", "100000000", "--orders"),
]


def _flag(command: str, flag: str, value: str, words: str) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        source = masked(d) if command in ("sample", "infill") else corpus(d, 3)
        return t.refused(
            d,
            [
                *command.split(),
                source,
                *(["--id-column", "id"] if source.endswith(".jsonl") else []),
                flag,
                value,
                "--model",
                M,
                "--output",
                "out",
            ],
            [words],
        )

    return run


for _id, _command, _flag_name, _value, _words in FLAG_CASES:
    case(_id, f"{_command} {_flag_name} {_value}", f"{REFUSED_LINE}: '{_words}'")(
        _flag(_command, _flag_name, _value, _words)
    )


@case("B57", "sample JSONL with a repeated id", f"{REFUSED_LINE}, naming --allow-duplicate-ids")
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[("a", MASKED[0]), ("a", MASKED[1])])
    return t.refused(
        d, ["sample", source, "--id-column", "id", "--model", M, "--output", "out"], ["--allow-duplicate-ids"]
    )


@case("B58", "audit an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["audit", write(d, "empty.jsonl", ""), "--model", M, "--output", "out"], rows_in=0)


@case("B59", "audit JSONL with a repeated id", f"{REFUSED_LINE}, naming --allow-duplicate-ids")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "a.jsonl", [{"id": "x", "text": "a dog"}, {"id": "x", "text": "the fox"}])
    return t.refused(
        d, ["audit", source, "--id-column", "id", "--model", M, "--output", "out"], ["--allow-duplicate-ids"]
    )


@case("B60", "audit with --partition-column naming no field", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "a.jsonl", [{"id": "x", "text": "a dog"}])
    return t.refused(
        d,
        ["audit", source, "--id-column", "id", "--partition-column", "source", "--model", M, "--output", "out"],
        ["source"],
    )


INFILL_BAD = [
    ("a", MASKED[0]),
    ("a", None),
    ("b", MASKED[1]),
    ("b", "no mask token here"),
    ("c", MASKED[2]),
    ("c", MASKED[3]),
]


@case(
    "B61",
    "infill repeated ids with a null text and a row without [MASK]",
    f"{REFUSED_LINE}, naming --allow-duplicate-ids",
)
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(
        d,
        ["infill", masked(d, rows=INFILL_BAD), "--id-column", "id", "--model", M, "--output", "out"],
        ["--allow-duplicate-ids"],
    )


@case("B62", "the same with --allow-duplicate-ids", f"{ROWS_LINE} (6 rows, 2 errors)")
def _(t: Trial, d: Path) -> Outcome:
    return t.rows_ok(
        d,
        [
            "infill",
            masked(d, rows=INFILL_BAD),
            "--id-column",
            "id",
            "--allow-duplicate-ids",
            "--beam",
            "2",
            "--model",
            M,
            "--output",
            "out",
        ],
        rows_in=6,
        errors=2,
    )


@case("B63", "infill a row without [MASK] among good rows", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[("a", MASKED[0]), ("b", "no mask here"), ("c", MASKED[1])])
    return t.rows_ok(
        d, ["infill", source, "--id-column", "id", "--beam", "2", "--model", M, "--output", "out"], rows_in=3, errors=1
    )


@case("B64", "infill an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["infill", write(d, "empty.jsonl", ""), "--model", M, "--output", "out"], rows_in=0)


def _rescore(t: Trial, d: Path, dev: str, test: str, words: Sequence[str]) -> Outcome:
    return t.refused(d, ["rescore", "--dev", dev, "--test", test, "--model", M, "--output", "out"], words)


@case("B65", "rescore with an empty --dev", f"{REFUSED_LINE}: 'no hypotheses'")
def _(t: Trial, d: Path) -> Outcome:
    return _rescore(t, d, write(d, "dev.jsonl", ""), nbest(d, "test.jsonl"), ["--dev dev.jsonl", "no hypotheses"])


@case("B66", "rescore with an empty --test", f"{REFUSED_LINE}: 'no hypotheses'")
def _(t: Trial, d: Path) -> Outcome:
    return _rescore(t, d, nbest(d, "dev.jsonl"), write(d, "test.jsonl", ""), ["--test test.jsonl", "no hypotheses"])


@case("B67", "rescore with both lists empty", f"{REFUSED_LINE}, naming no internal file")
def _(t: Trial, d: Path) -> Outcome:
    o = _rescore(t, d, write(d, "dev.jsonl", ""), write(d, "test.jsonl", ""), ["no hypotheses"])
    o.check("texts.parquet" not in o.line, "the line names texts.parquet")
    return o


def _rank(rank: int) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        records = [json.loads(line) for line in (d / nbest(d, "dev.jsonl")).read_text().splitlines()]
        records[1]["hyp_id"] = rank
        dev = jsonl(d, "dev.jsonl", records)
        return _rescore(t, d, dev, dev, [f"`hyp_id` {rank} is not a rank", "line 2"])

    return run


case("B68", "rescore with hyp_id 0", f"{REFUSED_LINE}: 'not a rank', line 2")(_rank(0))
case("B69", "rescore with hyp_id -1", f"{REFUSED_LINE}: 'not a rank', line 2")(_rank(-1))


@case("B70", "rescore with a repeated (utt_id, hyp_id)", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    records = [json.loads(line) for line in (d / nbest(d, "dev.jsonl")).read_text().splitlines()]
    dev = jsonl(d, "dev.jsonl", records + [records[0]])
    return _rescore(t, d, dev, dev, ["dev.jsonl"])


@case("B71", "rescore with a hypothesis without text", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    records = [json.loads(line) for line in (d / nbest(d, "dev.jsonl")).read_text().splitlines()]
    del records[2]["text"]
    dev = jsonl(d, "dev.jsonl", records)
    return _rescore(t, d, dev, dev, ["dev.jsonl"])


@case("B72", "score JSONL whose 2nd record is nested 3,000 deep", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    deep = '{"text": ' + "[" * 3000 + "]" * 3000 + "}"
    source = write(d, "deep.jsonl", '{"text": "a dog"}\n' + deep + '\n{"text": "the fox"}\n')
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case(
    "B73", "score a 2 MiB line (over the 1 MiB record limit) between two short ones", f"{ROWS_LINE} (3 rows, 1 error)"
)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "huge.txt", "a dog\n" + "word " * (2 << 18) + "\nthe fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B74", "rescore an N-best list whose 2nd utterance is nested 3,000 deep", f"{ROWS_LINE}, or {REFUSED_LINE}")
def _(t: Trial, d: Path) -> Outcome:
    good = '{"utt_id": "u1", "hyps": [{"text": "a dog"}, {"text": "the dog"}], "ref": "a dog"}'
    deep = '{"utt_id": "u2", "hyps": ' + "[" * 3000 + "]" * 3000 + "}"
    dev = write(d, "dev.jsonl", f"{good}\n{deep}\n")
    call = t.call(d, "rescore", "--dev", dev, "--test", dev, "--model", M, "--output", "out")
    o = t.observe(call, d, "out", None)
    o.check(not call.traceback, "a traceback")
    o.check(call.rc in (0, 2), f"exit {call.rc}")
    if call.rc == 2:
        t.one_line(o, call, 2, ["line 2"])
    return o
