"""The adversarial trial: an operator who feeds `dscore` bad inputs, kills it, damages its folders, makes
every operator mistake docs/runs.md refuses and tries a few attacks, one case at a time, against
the real CLI; one table row per case, judged against what docs/runs.md promises.

    .venv/bin/python benchmarks/adversarial.py --output out/adversarial [--update docs/reliability.md]
    .venv/bin/python benchmarks/adversarial.py --output out/adversarial --only F0 --only O01   # some cases

Every case works in a folder of its own under `--output`, with tiny random models (BERT, RoBERTa) built
there by tests/tiny.py (no downloads), and judges what it sees: the exit code, the one `dscore` line on
standard error and whether a traceback came with it, rows in against rows out and repeated ids (read from
the marked shards, as dscore's readers read a folder), and `dscore verify`'s verdict on the folder
afterwards. A case passes when all of that is what docs/runs.md says; a failed case keeps its reasons.

How the CLI is run: by default each command is `distributed_scoring.cli.main(argv)` in a process forked
from this one after torch, transformers and pyarrow are imported (a real process with its own exit code,
standard streams, working directory and a pid to kill -9; only the seconds of imports are saved, so that
the trial takes minutes, not an hour, on 2 cores). `--spawn` runs every command as `python -m
distributed_scoring.cli` instead. The `--ray` cases always spawn (an embedded Ray is started by a fresh
driver), and the full-disk cases always fork (the full disk is a filesystem patched into the child, the
technique of tests/faults/test_disk_full.py).

Writes `adversarial.json` (every case with what it observed) and `adversarial.md` (the table) under
`--output`; `--update PAGE` writes the page docs/reliability.md (how to run it, counts, the table).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TESTS = ROOT / "tests"
BAD = TESTS / "data" / "bad"
for _path in (ROOT, TESTS, TESTS / "faults"):  # tests/tiny.py, tests/faults/test_disk_full.py
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}.items():
    os.environ.setdefault(_name, _value)

BAD_INPUT, FAULT, MISTAKE, ATTACK = "bad input", "fault", "operator mistake", "attack"
STOP = "stop and check"  # signals, models found unusable, the machine's limits
CATEGORIES = (BAD_INPUT, FAULT, MISTAKE, ATTACK, STOP)
TIMEOUT_S = 300.0  # one command; a run of a case's few rows takes seconds
RAY_TIMEOUT_S = 420.0
DUPLICATE_KEYS = ("construction", "sequence", "chain", "epoch", "line")  # with `id`, a row's key where present
CORPUS_LINES = 12
MASKED = [
    "the quick brown [MASK] jumps",
    "she sells [MASK] by the seashore",
    "a [MASK] dog",
    "colourless green [MASK] sleep furiously",
]


# Running the CLI


@dataclass
class Call:
    """One dscore command and what it did."""

    argv: list[str]
    rc: int | None  # None: killed by this trial
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        """The command's own lines on standard error: `dscore: error|incomplete: ...` or argparse's
        `dscore score: error: ...`."""
        return [line for line in self.err.splitlines() if line.startswith("dscore")]

    @property
    def line(self) -> str:
        return " / ".join(self.lines)

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.err

    @property
    def shown(self) -> str:
        return "dscore " + shlex.join(self.argv)


class Process:
    """A started command: its pid, waited for or killed."""

    def __init__(self, argv: list[str], pid: int, popen: subprocess.Popen | None, out: Path, err: Path) -> None:
        self.argv, self.pid, self.popen, self.out_path, self.err_path = argv, pid, popen, out, err
        self.rc: int | None = None
        self.killed = False

    def poll(self) -> int | None:
        if self.rc is None:
            if self.popen is not None:
                self.rc = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.rc = os.waitstatus_to_exitcode(status)
        return self.rc

    def wait(self, timeout_s: float) -> Call:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                break
            time.sleep(0.05)
        return self.call()

    def kill(self) -> None:
        """kill -9, then reap."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.killed = True
        if self.popen is not None:
            self.popen.wait()
        elif self.rc is None:
            os.waitpid(self.pid, 0)
        self.rc = None

    def call(self) -> Call:
        read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
        return Call(self.argv, None if self.killed else self.rc, read(self.out_path), read(self.err_path))


Prelude = Callable[[], None]


class Dscore:
    """Runs dscore commands in a case's folder: forked from this process (`fork`), as `python -m
    distributed_scoring.cli` (`spawn`), or in this very process (`inline`: the test's fast subset; no
    kills, no preludes)."""

    def __init__(self, mode: str = "fork") -> None:
        assert mode in ("fork", "spawn", "inline")
        self.mode = mode
        self.count = 0

    def start(
        self,
        argv: Sequence[str],
        cwd: Path,
        spawn: bool = False,
        prelude: Prelude | None = None,
        env: dict[str, str] | None = None,
    ) -> Process:
        argv = [str(a) for a in argv]
        self.count += 1
        logs = cwd / "_logs"
        logs.mkdir(parents=True, exist_ok=True)
        out, err = logs / f"{self.count:03d}.out", logs / f"{self.count:03d}.err"
        if (spawn or self.mode == "spawn") and prelude is None:
            with out.open("wb") as o, err.open("wb") as e:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "distributed_scoring.cli", *argv],
                    cwd=cwd,
                    stdout=o,
                    stderr=e,
                    env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                    start_new_session=True,
                )
            return Process(argv, popen.pid, popen, out, err)
        assert self.mode != "inline", "the inline runner runs commands to their end: use call()"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: dscore's main with this case's folder and files, then exit with its code
            rc = 1
            try:
                os.setsid()
                os.chdir(cwd)
                os.environ.update(env or {})
                for fd, path in ((1, out), (2, err)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                if prelude is not None:
                    prelude()
                from distributed_scoring.cli import main

                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # what `python -m` would print
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(rc)
        return Process(argv, pid, None, out, err)

    def call(self, argv: Sequence[str], cwd: Path, timeout_s: float = TIMEOUT_S, **kwargs) -> Call:
        if self.mode == "inline" and not kwargs.get("spawn"):
            return self._inline([str(a) for a in argv], cwd)
        return self.start(argv, cwd, **kwargs).wait(RAY_TIMEOUT_S if "--ray" in argv else timeout_s)

    @staticmethod
    def _inline(argv: list[str], cwd: Path) -> Call:
        from distributed_scoring.cli import main

        out, err = io.StringIO(), io.StringIO()
        here = os.getcwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(argv)
                except SystemExit as exc:
                    rc = exc.code if isinstance(exc.code, int) else 1
                except Exception:
                    traceback.print_exc()
                    rc = 1
        finally:
            os.chdir(here)
        return Call(argv, rc, out.getvalue(), err.getvalue())


def full_disk(kind: str, n: int) -> Prelude:
    """In the child: the `n`-th file of `kind` ('shard', 'marker', 'run file') written into the output
    folder finds the disk full (tests/faults/test_disk_full.py's filesystem)."""

    def patch() -> None:
        from distributed_scoring.io import output

        from test_disk_full import full_disk_at

        disk = full_disk_at(kind, n)
        output.filesystem = lambda uri: (disk, str(Path(uri).resolve()))

    return patch


# Reading a folder as dscore's readers do


@dataclass
class Rows:
    """The rows of a run folder's marked shards."""

    n: int
    duplicates: int  # keys (id, and the row's place in a multi-row output) that occur more than once
    errors: int


def marked_rows(folder: Path) -> Rows | None:
    import pyarrow.parquet as pq

    done = folder / "_done"
    if not done.is_dir():
        return None
    keys: Counter = Counter()
    n = errors = 0
    for marker in sorted(done.glob("*.json")):
        path = folder / "rows" / f"part-{marker.stem}.parquet"
        try:
            table = pq.read_table(path, use_threads=False)
        except Exception:  # a damaged or missing shard: verify's business, the rows are not there
            continue
        columns = ["id", *(c for c in DUPLICATE_KEYS if c in table.column_names)]
        keys.update(zip(*(table.column(c).to_pylist() for c in columns)))
        n += table.num_rows
        errors += sum(s == "error" for s in table.column("status").to_pylist())
    return Rows(n, sum(1 for c in keys.values() if c > 1), errors)


def verdict(call: Call) -> str:
    """`dscore verify`'s verdict: OK, INCOMPLETE, FAILED, or `not a run` (exit 2)."""
    if call.rc == 2:
        return "not a run"
    last = [line for line in call.out.splitlines() if line.strip()]
    word = last[-1].split(":", 1)[0] if last else ""
    return word if word in ("OK", "INCOMPLETE", "FAILED") else f"? rc {call.rc}"


# A case and its outcome


@dataclass
class Outcome:
    """What a case observed, and what was wrong with it (nothing: PASS)."""

    command: str = ""
    done: str = ""  # what was done, when more than the command
    rc: int | None = None
    line: str = ""
    traceback: bool = False
    rows_in: int | None = None
    rows_out: int | None = None
    duplicates: int | None = None
    verdict: str = "-"
    problems: list[str] = field(default_factory=list)

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    what: str
    expected: str
    run: Callable[["Trial", Path], Outcome]
    ray: bool = False


class Trial:
    """What every case needs: the runner, the tiny models, the checks docs/runs.md promises."""

    def __init__(self, root: Path, dscore: Dscore) -> None:
        self.root = root
        self.dscore = dscore
        self.models = root / "_models"

    def model(self, family: str = "bert") -> str:
        folder = self.models / family
        if not (folder / "config.json").exists():
            import tiny

            tiny.save_tiny(family, folder)
        return str(folder)

    def warm(self) -> None:
        """Build the models and import what every command imports, once, before the first fork."""
        import pyarrow.parquet  # noqa: F401
        import transformers

        import distributed_scoring.cli  # noqa: F401
        import distributed_scoring.workflows.score  # noqa: F401

        for family in ("bert", "roberta"):
            transformers.AutoModelForMaskedLM.from_pretrained(self.model(family))
            transformers.AutoTokenizer.from_pretrained(self.model(family))

    def call(self, d: Path, *argv, **kwargs) -> Call:
        return self.dscore.call(list(argv), d, **kwargs)

    def verify(self, d: Path, folder: str | Path) -> str:
        return verdict(self.call(d, "verify", folder))

    # outcomes

    def observe(
        self, call: Call, d: Path, out: str | None, rows_in: int | None, done: str = "", rows_dir: str | None = None
    ) -> Outcome:
        o = Outcome(
            command=call.shown, done=done, rc=call.rc, line=call.line, traceback=call.traceback, rows_in=rows_in
        )
        folder = d / (rows_dir or out) if out else None
        rows = marked_rows(folder) if folder is not None else None
        if rows is not None:
            o.rows_out, o.duplicates = rows.n, rows.duplicates
        if out and (d / out).exists():
            o.verdict = self.verify(d, out)
        return o

    def refused(
        self,
        d: Path,
        argv: Sequence,
        words: Sequence[str] = (),
        out: str | None = "out",
        rows_in: int | None = None,
        done: str = "",
        untouched: dict | None = None,
        code: int = 2,
    ) -> Outcome:
        """Expected: exit 2, one line holding `words`, no traceback, nothing written (`out` not created, or
        the snapshot `untouched` of its files unchanged)."""
        call = self.call(d, *argv)
        o = self.observe(call, d, out, rows_in, done)
        self.one_line(o, call, code, words)
        if out is not None and untouched is None:
            o.check(not (d / out).exists(), f"{out}/ was created")
        if untouched is not None:
            o.check(snapshot(d / out) == untouched, f"files in {out}/ changed")
        return o

    @staticmethod
    def one_line(o: Outcome, call: Call, code: int, words: Sequence[str] = ()) -> None:
        o.check(call.rc == code, f"exit {call.rc}, expected {code}")
        o.check(len(call.lines) == 1, f"{len(call.lines)} dscore lines, expected one")
        o.check(not call.traceback, "a traceback")
        for word in words:
            o.check(word in call.line, f"the line lacks {word!r}")

    def complete(self, o: Outcome, call: Call, rows_in: int | None = None) -> Outcome:
        """Expected of a finished run: exit 0, no traceback, rows in == rows out, no repeated id, verify OK."""
        rows_in = o.rows_in if rows_in is None else rows_in
        o.check(call.rc == 0, f"exit {call.rc}, expected 0")
        o.check(not call.traceback, "a traceback")
        o.check(o.rows_out == rows_in, f"rows out {o.rows_out} != rows in {rows_in}")
        o.check(o.duplicates == 0, f"{o.duplicates} repeated ids")
        o.check(o.verdict == "OK", f"verify says {o.verdict}")
        return o

    def rows_ok(
        self,
        d: Path,
        argv: Sequence,
        rows_in: int,
        errors: int | None = None,
        out: str = "out",
        done: str = "",
        rows_dir: str | None = None,
    ) -> Outcome:
        """Expected: exit 0, an error row per bad row (`errors`), rows in == rows out, verify OK."""
        call = self.call(d, *argv)
        o = self.observe(call, d, out, rows_in, done, rows_dir)
        self.complete(o, call)
        if errors is not None:
            rows = marked_rows(d / (rows_dir or out))
            got = rows.errors if rows else None
            o.check(got == errors, f"{got} error rows, expected {errors}")
        return o

    def clear(self, d: Path, argv: Sequence, rows_in: int, out: str = "out") -> Outcome:
        """Either answer is clear: refused in one line (exit 2, nothing written) or rows in == rows out."""
        existed = (d / out).exists()
        before = snapshot(d / out)
        call = self.call(d, *argv)
        o = self.observe(call, d, out, rows_in)
        if call.rc == 2:
            self.one_line(o, call, 2)
            o.check(
                snapshot(d / out) == before if existed else not (d / out).exists(),
                f"{out}/ was changed" if existed else f"{out}/ was created",
            )
        else:
            self.complete(o, call)
        return o


def snapshot(folder: Path) -> dict[str, bytes]:
    return (
        {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and "_logs" not in p.parts
        }
        if folder.exists()
        else {}
    )


# Inputs


M, R = "../_models/bert", "../_models/roberta"  # each case runs in <output>/<case id>/


def write(d: Path, name: str, text: str | bytes) -> str:
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return name


def jsonl(d: Path, name: str, records: Sequence[object]) -> str:
    return write(d, name, "".join(json.dumps(r) + "\n" for r in records))


def corpus(d: Path, n: int = CORPUS_LINES, name: str = "c.txt") -> str:
    import tiny

    return write(d, name, "".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(n)))


def parquet(d: Path, name: str, columns: dict[str, list]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), d / name, row_group_size=2)
    return name


def nbest(d: Path, name: str, utterances: int = 3, hyps: int = 2, prefix: str = "u") -> str:
    import tiny

    records = [
        {
            "utt_id": f"{prefix}{u}",
            "hyp_id": h,
            "text": tiny.CORPUS[(u * hyps + h) % len(tiny.CORPUS)],
            "score": -1.0 * h - u / 10,
            "ref": tiny.CORPUS[(u * hyps + 1) % len(tiny.CORPUS)],
        }
        for u in range(1, utterances + 1)
        for h in range(1, hyps + 1)
    ]
    return jsonl(d, name, records)


def masked(d: Path, name: str = "m.jsonl", rows: Sequence[tuple[str, str | None]] | None = None) -> str:
    rows = rows if rows is not None else [(f"r{i}", text) for i, text in enumerate(MASKED)]
    return jsonl(d, name, [{"id": i, "text": t} for i, t in rows])


# The cases

CASES: list[Case] = []


def case(id: str, category: str, what: str, expected: str, ray: bool = False):
    def register(fn: Callable[[Trial, Path], Outcome]) -> Callable[[Trial, Path], Outcome]:
        CASES.append(Case(id, category, what, expected, fn, ray))
        return fn

    return register


REFUSED_LINE = "exit 2, one line, no traceback, nothing written"
ROWS_LINE = "exit 0, rows in == rows out, an error row per bad row, verify OK"
CLEAR_LINE = "exit 2 in one line, or exit 0 with rows in == rows out and verify OK"

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
        BAD_INPUT,
        f"score tests/data/bad/{_path.name}",
        f"{ROWS_LINE} ({_expected[0]} rows, {_expected[1]} errors)"
        if isinstance(_expected, tuple)
        else f"{REFUSED_LINE}: '{_expected}'",
    )(_bad_file(_path.name))


@case("B20", BAD_INPUT, "score an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["score", write(d, "empty.txt", ""), "--model", M, "--output", "out"], rows_in=0)


@case("B21", BAD_INPUT, "score an empty directory", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    (d / "data").mkdir()
    return t.refused(d, ["score", "data", "--model", M, "--output", "out"], ["data"])


@case("B22", BAD_INPUT, "score a directory of hidden and _-prefixed files only (_meta.json, .hidden)", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    write(d, "data/_meta.json", "{}\n")
    write(d, "data/.hidden", "x\n")
    return t.refused(d, ["score", "data", "--model", M, "--output", "out"], ["data"])


@case("B23", BAD_INPUT, "score a CSV without the text column", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(d, ["score", write(d, "t.csv", "id,sentence\n1,a b\n"), "--model", M, "--output", "out"], ["text"])


@case("B24", BAD_INPUT, "score JSONL with a null text among 3", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "n.jsonl", [{"text": "a dog"}, {"text": None}, {"text": "the fox"}])
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B25", BAD_INPUT, "score JSONL whose 2nd record lacks the text field", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "n.jsonl", [{"text": "a dog"}, {"other": "x"}, {"text": "the fox"}])
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B26", BAD_INPUT, "score a 300,000-character line between two short ones", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "long.txt", "a dog\n" + "word " * 60000 + "\nthe fox\n")
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B27", BAD_INPUT, "score blank and whitespace-only lines", f"{ROWS_LINE} (5 rows, 3 errors)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "blank.txt", "a dog\n\n   \n\t\nthe fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=5, errors=3)


@case("B28", BAD_INPUT, 'score JSONL with ids 1 and "1"', f"{REFUSED_LINE}, naming the ids and lines")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "i.jsonl", [{"id": 1, "text": "a dog"}, {"id": "1", "text": "the fox"}])
    return t.refused(
        d,
        ["score", source, "--id-column", "id", "--model", M, "--output", "out"],
        ["'1' at i.jsonl line 1 and i.jsonl line 2", "--allow-duplicate-ids"],
    )


@case("B29", BAD_INPUT, "score Parquet with ids [1, 2, 2]", f"{REFUSED_LINE}, naming the ids and rows")
def _(t: Trial, d: Path) -> Outcome:
    source = parquet(d, "p.parquet", {"id": [1, 2, 2], "text": ["a dog", "the fox", "a cat"]})
    return t.refused(
        d,
        ["score", source, "--id-column", "id", "--model", M, "--output", "out"],
        ["'2' at p.parquet row 2 and p.parquet row 3"],
    )


@case("B30", BAD_INPUT, "score a text file with one Latin-1 (not UTF-8) line", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "latin.txt", "a dog\n".encode() + "caf\xe9 cr\xe8me\n".encode("latin-1") + b"the fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case(
    "B31", BAD_INPUT, 'score JSONL lines that are not objects ([1,2], "s", 42, null)', f"{ROWS_LINE} (5 rows, 4 errors)"
)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "o.jsonl", '{"text": "a dog"}\n[1, 2]\n"s"\n42\nnull\n')
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=5, errors=4)


@case("B32", BAD_INPUT, "score JSONL with a malformed line", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "m.jsonl", '{"text": "a dog"}\n{"text": "the f\n{"text": "a cat"}\n')
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=3, errors=1)


@case("B33", BAD_INPUT, "score a CSV row with extra fields", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "r.csv", "id,text\n1,a dog\n2,the fox,extra,more\n3,a cat\n")
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], rows_in=3)


@case("B34", BAD_INPUT, "score a file that does not exist", f"{REFUSED_LINE}, naming it")
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(d, ["score", "missing.txt", "--model", M, "--output", "out"], ["missing.txt"])


@case("B35", BAD_INPUT, "score a spreadsheet (.xlsx: a zip archive)", f"{REFUSED_LINE}: 'is not a text file'")
def _(t: Trial, d: Path) -> Outcome:
    import zipfile

    with zipfile.ZipFile(d / "sheet.xlsx", "w") as z:  # what a spreadsheet is: any suffix is read as text lines
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/worksheets/sheet1.xml", "<worksheet><sheetData/></worksheet>")
    return t.refused(d, ["score", "sheet.xlsx", "--model", M, "--output", "out"], ["sheet.xlsx is not a text file"])


@case("B36", BAD_INPUT, "score a line holding a NUL byte", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(
        d, ["score", write(d, "nul.txt", b"a dog\nthe\x00fox\na cat\n"), "--model", M, "--output", "out"], rows_in=3
    )


@case("B37", BAD_INPUT, "score JSONL with --text-column naming no field", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "t.jsonl", [{"text": "a dog"}])
    return t.refused(d, ["score", source, "--text-column", "sentence", "--model", M, "--output", "out"], ["sentence"])


@case("B38", BAD_INPUT, "score JSONL with --id-column naming no field", f"{REFUSED_LINE}, naming the column")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "t.jsonl", [{"text": "a dog"}])
    return t.refused(d, ["score", source, "--id-column", "key", "--model", M, "--output", "out"], ["key"])


@case("B39", BAD_INPUT, "score Parquet with a null id", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = parquet(d, "p.parquet", {"id": ["a", None, "c"], "text": ["a dog", "the fox", "a cat"]})
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], rows_in=3)


@case("B40", BAD_INPUT, "score a UTF-8 file with a byte-order mark", f"{ROWS_LINE} (2 rows, 0 errors)")
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "bom.txt", "\ufeffa dog\nthe fox\n")
    return t.rows_ok(d, ["score", source, "--model", M, "--output", "out"], rows_in=2, errors=0)


@case("B41", BAD_INPUT, "score texts of special tokens only ([CLS] [SEP] [MASK], <s>)", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = write(d, "s.txt", "[CLS] [SEP]\n[MASK] [MASK]\n<s></s>\n")
    return t.clear(d, ["score", source, "--model", M, "--output", "out"], rows_in=3)


@case("B42", BAD_INPUT, "score Parquet whose text column holds integers", CLEAR_LINE)
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
    case(_id, BAD_INPUT, f"{_command} {_flag_name} {_value}", f"{REFUSED_LINE}: '{_words}'")(
        _flag(_command, _flag_name, _value, _words)
    )


@case("B57", BAD_INPUT, "sample JSONL with a repeated id", f"{REFUSED_LINE}, naming --allow-duplicate-ids")
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[("a", MASKED[0]), ("a", MASKED[1])])
    return t.refused(
        d, ["sample", source, "--id-column", "id", "--model", M, "--output", "out"], ["--allow-duplicate-ids"]
    )


@case("B58", BAD_INPUT, "audit an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["audit", write(d, "empty.jsonl", ""), "--model", M, "--output", "out"], rows_in=0)


@case("B59", BAD_INPUT, "audit JSONL with a repeated id", f"{REFUSED_LINE}, naming --allow-duplicate-ids")
def _(t: Trial, d: Path) -> Outcome:
    source = jsonl(d, "a.jsonl", [{"id": "x", "text": "a dog"}, {"id": "x", "text": "the fox"}])
    return t.refused(
        d, ["audit", source, "--id-column", "id", "--model", M, "--output", "out"], ["--allow-duplicate-ids"]
    )


@case("B60", BAD_INPUT, "audit with --partition-column naming no field", f"{REFUSED_LINE}, naming the column")
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
    BAD_INPUT,
    "infill repeated ids with a null text and a row without [MASK]",
    f"{REFUSED_LINE}, naming --allow-duplicate-ids",
)
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(
        d,
        ["infill", masked(d, rows=INFILL_BAD), "--id-column", "id", "--model", M, "--output", "out"],
        ["--allow-duplicate-ids"],
    )


@case("B62", BAD_INPUT, "the same with --allow-duplicate-ids", f"{ROWS_LINE} (6 rows, 2 errors)")
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


@case("B63", BAD_INPUT, "infill a row without [MASK] among good rows", f"{ROWS_LINE} (3 rows, 1 error)")
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[("a", MASKED[0]), ("b", "no mask here"), ("c", MASKED[1])])
    return t.rows_ok(
        d, ["infill", source, "--id-column", "id", "--beam", "2", "--model", M, "--output", "out"], rows_in=3, errors=1
    )


@case("B64", BAD_INPUT, "infill an empty file", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.clear(d, ["infill", write(d, "empty.jsonl", ""), "--model", M, "--output", "out"], rows_in=0)


def _rescore(t: Trial, d: Path, dev: str, test: str, words: Sequence[str]) -> Outcome:
    return t.refused(d, ["rescore", "--dev", dev, "--test", test, "--model", M, "--output", "out"], words)


@case("B65", BAD_INPUT, "rescore with an empty --dev", f"{REFUSED_LINE}: 'no hypotheses'")
def _(t: Trial, d: Path) -> Outcome:
    return _rescore(t, d, write(d, "dev.jsonl", ""), nbest(d, "test.jsonl"), ["--dev dev.jsonl", "no hypotheses"])


@case("B66", BAD_INPUT, "rescore with an empty --test", f"{REFUSED_LINE}: 'no hypotheses'")
def _(t: Trial, d: Path) -> Outcome:
    return _rescore(t, d, nbest(d, "dev.jsonl"), write(d, "test.jsonl", ""), ["--test test.jsonl", "no hypotheses"])


@case("B67", BAD_INPUT, "rescore with both lists empty", f"{REFUSED_LINE}, naming no internal file")
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


case("B68", BAD_INPUT, "rescore with hyp_id 0", f"{REFUSED_LINE}: 'not a rank', line 2")(_rank(0))
case("B69", BAD_INPUT, "rescore with hyp_id -1", f"{REFUSED_LINE}: 'not a rank', line 2")(_rank(-1))


@case("B70", BAD_INPUT, "rescore with a repeated (utt_id, hyp_id)", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    records = [json.loads(line) for line in (d / nbest(d, "dev.jsonl")).read_text().splitlines()]
    dev = jsonl(d, "dev.jsonl", records + [records[0]])
    return _rescore(t, d, dev, dev, ["dev.jsonl"])


@case("B71", BAD_INPUT, "rescore with a hypothesis without text", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    records = [json.loads(line) for line in (d / nbest(d, "dev.jsonl")).read_text().splitlines()]
    del records[2]["text"]
    dev = jsonl(d, "dev.jsonl", records)
    return _rescore(t, d, dev, dev, ["dev.jsonl"])


# Faults: kills, damaged folders, changed inputs, locks, a full disk

KILL_LINES = 24  # twelve shards of 2 rows: the kill falls mid-run
SURVIVED_LINE = "verify before the rerun not OK; the rerun exit 0, rows in == rows out, no repeated id, verify OK"


def distinct_texts(d: Path, *sources: str) -> int:
    """The rows of a rescore's MLM run: each distinct hypothesis text of its N-best lists once."""
    return len({json.loads(line)["text"] for s in sources for line in (d / s).read_text().splitlines()})


def markers(folder: Path) -> int:
    return len(list((folder / "_done").glob("*.json"))) if (folder / "_done").is_dir() else 0


def kill_midway(t: Trial, d: Path, argv: Sequence[str], folder: str, at_least: int = 2, spawn: bool = False) -> Call:
    """Start the command, kill -9 its driver once `at_least` shards are marked in `folder`."""
    process = t.dscore.start(argv, d, spawn=spawn)
    deadline = time.monotonic() + (RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    while markers(d / folder) < at_least and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = process.poll() is None
    descendants = _descendants(process.pid)
    process.kill()
    _reap(descendants)
    call = process.call()
    if not alive:
        call.err += "\n(trial: the command ended before the kill)"
    return call


def _descendants(pid: int) -> list:
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _reap(processes: list, grace_s: float = 30.0) -> None:
    """The killed driver's processes (an embedded Ray's) end by themselves (its watchdog); any still there
    after `grace_s` is killed, so that the trial leaves nothing behind."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=10)


def survived(
    t: Trial,
    d: Path,
    argv: Sequence[str],
    rows_in: int,
    done: str,
    damage: Callable[[], object] | None,
    out: str = "out",
    rows_dir: str | None = None,
    killed: Call | None = None,
    spawn: bool = False,
) -> Outcome:
    """After a kill or `damage` to a finished folder: verify is not OK, the rerun completes."""
    if damage is not None:
        first = t.call(d, *argv, spawn=spawn)
        if first.rc != 0:
            o = t.observe(first, d, out, rows_in, done, rows_dir)
            o.problems.append(f"the first run ended with exit {first.rc}")
            return o
        damage()
    before = t.verify(d, out)
    rerun = t.call(d, *argv, spawn=spawn)
    o = t.observe(rerun, d, out, rows_in, f"{done}; verify before the rerun: {before}", rows_dir)
    if killed is not None:
        o.check(killed.rc is None and "ended before the kill" not in killed.err, "the command ended before the kill")
    o.check(before in ("INCOMPLETE", "FAILED"), f"verify before the rerun says {before}")
    o.check(len(rerun.lines) == 0, f"the rerun printed {rerun.line!r}")
    return t.complete(o, rerun)


def _score(source: str, *extra: str, out: str = "out") -> list[str]:
    return ["score", source, "--model", M, "--output", out, "--shard-rows", "2", *extra]


@case("F01", FAULT, "kill -9 of the driver mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d, KILL_LINES))
    killed = kill_midway(t, d, argv, "out")
    return survived(t, d, argv, KILL_LINES, "killed after 2 of 12 shards", None, killed=killed)


@case("F02", FAULT, "kill -9 of the driver twice, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d, KILL_LINES))
    kill_midway(t, d, argv, "out", 2)
    killed = kill_midway(t, d, argv, "out", 6)
    return survived(t, d, argv, KILL_LINES, "killed after 2, then after 6 of 12 shards", None, killed=killed)


@case("F03", FAULT, "kill -9 of `audit` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    import tiny

    source = jsonl(
        d,
        "a.jsonl",
        [{"id": f"r{i}", "text": tiny.CORPUS[i % len(tiny.CORPUS)], "source": f"s{i % 2}"} for i in range(KILL_LINES)],
    )
    argv = [
        "audit",
        source,
        "--id-column",
        "id",
        "--partition-column",
        "source",
        "--model",
        M,
        "--output",
        "out",
        "--shard-rows",
        "2",
    ]
    killed = kill_midway(t, d, argv, "out")
    return survived(t, d, argv, KILL_LINES, "killed after 2 of 12 shards", None, killed=killed)


@case("F04", FAULT, "kill -9 of `infill` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[(f"r{i}", MASKED[i % len(MASKED)]) for i in range(KILL_LINES)])
    argv = ["infill", source, "--id-column", "id", "--beam", "2", "--model", M, "--output", "out", "--shard-rows", "2"]
    killed = kill_midway(t, d, argv, "out")
    return survived(t, d, argv, KILL_LINES, "killed after 2 of 12 shards", None, killed=killed)


@case("F05", FAULT, "kill -9 of `sample` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[(f"r{i}", MASKED[i % len(MASKED)].replace("[MASK]", "cat")) for i in range(KILL_LINES)])
    argv = [
        "sample",
        source,
        "--id-column",
        "id",
        "--epochs",
        "2",
        "--model",
        M,
        "--output",
        "out",
        "--shard-rows",
        "2",
    ]
    killed = kill_midway(t, d, argv, "out")
    return survived(
        t, d, argv, KILL_LINES * 2, "killed after 2 of 12 shards (2 recorded epochs a row)", None, killed=killed
    )


@case("F06", FAULT, "kill -9 of `rescore` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = [
        "rescore",
        "--dev",
        nbest(d, "dev.jsonl", 6, 2, "d"),
        "--test",
        nbest(d, "test.jsonl", 6, 2, "t"),
        "--model",
        M,
        "--output",
        "out",
        "--shard-rows",
        "2",
    ]
    killed = kill_midway(t, d, argv, "out/mlm")
    return survived(
        t,
        d,
        argv,
        distinct_texts(d, argv[2], argv[4]),
        "killed after 2 shards of its MLM run (rows: the distinct texts it scores)",
        None,
        rows_dir="out/mlm",
        killed=killed,
    )


@case(
    "F07",
    FAULT,
    "kill -9 of the driver mid-run on an embedded Ray (`--ray`), then the same command",
    SURVIVED_LINE,
    ray=True,
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d, KILL_LINES), "--ray", "--num-actors", "1", "--stall-timeout", "300")
    killed = kill_midway(t, d, argv, "out", spawn=True)
    return survived(
        t,
        d,
        argv,
        KILL_LINES,
        "killed after 2 of 12 shards; its Ray's processes end on their own",
        None,
        killed=killed,
        spawn=True,
    )


def _damage(
    name: str, what: str, damage: Callable[[Path], object], extra: Sequence[str] = (), ray: bool = False
) -> None:
    def run(t: Trial, d: Path) -> Outcome:
        argv = _score(corpus(d), *extra)
        return survived(t, d, argv, CORPUS_LINES, what, lambda: damage(d / "out"), spawn=ray)

    case(name, FAULT, f"{what} of a finished run, verify, the same command", SURVIVED_LINE, ray=ray)(run)


LAST = "00000-000000000010"  # the last of six shards of 2 rows
_damage("F08", "delete the last shard's file", lambda o: (o / "rows" / f"part-{LAST}.parquet").unlink())
_damage(
    "F09",
    "truncate a shard's file to half",
    lambda o: (o / "rows" / f"part-{LAST}.parquet").write_bytes(
        (o / "rows" / f"part-{LAST}.parquet").read_bytes()[:200]
    ),
)
_damage(
    "F10",
    "overwrite a shard's file with garbage of its size",
    lambda o: (o / "rows" / f"part-{LAST}.parquet").write_bytes(
        b"\x00" * (o / "rows" / f"part-{LAST}.parquet").stat().st_size
    ),
)
_damage("F11", "delete a marker", lambda o: (o / "_done" / f"{LAST}.json").unlink())
_damage("F12", "empty a marker", lambda o: (o / "_done" / f"{LAST}.json").write_text(""))
_damage("F13", "garbage in a marker", lambda o: (o / "_done" / f"{LAST}.json").write_text("{not json"))
_damage(
    "F14",
    "a marker counting 3 rows for a shard of 2",
    lambda o: (o / "_done" / f"{LAST}.json").write_text(
        json.dumps({**json.loads((o / "_done" / f"{LAST}.json").read_text()), "rows": 3})
    ),
)
_damage("F15", "delete summary.json", lambda o: (o / "summary.json").unlink())
_damage(
    "F16",
    "a summary.json counting 99 rows",
    lambda o: (o / "summary.json").write_text(json.dumps({**json.loads((o / "summary.json").read_text()), "rows": 99})),
)
_damage(
    "F17",
    "delete a marker and its shard's file, leave a stale .tmp",
    lambda o: (
        (o / "_done" / f"{LAST}.json").unlink(),
        (o / "rows" / f"part-{LAST}.parquet").rename(o / "rows" / f".part-{LAST}.parquet.tmp"),
    ),
)
_damage(
    "F18",
    "delete a marker, then rerun on an embedded Ray (`--ray`)",
    lambda o: (o / "_done" / f"{LAST}.json").unlink(),
    ("--ray", "--num-actors", "1"),
    ray=True,
)


@case(
    "F19",
    FAULT,
    "delete _run.json of a finished run, verify, the same command",
    "verify not OK; the rerun refused in one line (the folder holds no run), nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    t.call(d, *argv)
    (d / "out" / "_run.json").unlink()
    before = t.verify(d, "out")
    o = t.refused(
        d, argv, ["_run.json"], rows_in=CORPUS_LINES, untouched=snapshot(d / "out"), done=f"verify before: {before}"
    )
    o.check(before != "OK", f"verify before the rerun says {before}")
    return o


@case(
    "F20",
    FAULT,
    "garbage in _run.json of a finished run, verify, the same command",
    "verify not OK; the rerun refused in one line, nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    t.call(d, *argv)
    (d / "out" / "_run.json").write_text("{garbage")
    before = t.verify(d, "out")
    o = t.refused(
        d, argv, ["_run.json"], rows_in=CORPUS_LINES, untouched=snapshot(d / "out"), done=f"verify before: {before}"
    )
    o.check(before != "OK", f"verify before the rerun says {before}")
    return o


@case(
    "F21",
    FAULT,
    "kill -9 mid-run, edit a scored line of the input, the same command; then --overwrite",
    "the rerun refused in one line naming the file and shard; --overwrite completes, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d, KILL_LINES)
    argv = _score(source)
    kill_midway(t, d, argv, "out")
    text = (d / source).read_text().splitlines()
    (d / source).write_text("\n".join(["An edited first line."] + text[1:]) + "\n")
    refused = t.call(d, *argv)
    o = t.observe(refused, d, "out", KILL_LINES, "killed after 2 shards, line 1 edited")
    t.one_line(o, refused, 2, [source, "00000-000000000000"])
    again = t.call(d, *argv, "--overwrite")
    after = t.observe(again, d, "out", KILL_LINES)
    o.rows_out, o.duplicates, o.verdict = after.rows_out, after.duplicates, after.verdict
    o.done += "; then --overwrite"
    t.complete(o, again)
    return o


@case(
    "F22",
    FAULT,
    "append lines to the input of a finished run, the same command",
    "refused in one line (a different run: --overwrite or another --output), nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    argv = _score(source)
    t.call(d, *argv)
    with (d / source).open("a") as f:
        f.write("One more line.\n")
    return t.refused(d, argv, [source], rows_in=CORPUS_LINES, untouched=snapshot(d / "out"), done="1 line appended")


@case(
    "F23",
    FAULT,
    "touch the input of a finished run (mtime only), the same command",
    "exit 0, nothing scored again, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    argv = _score(source)
    t.call(d, *argv)
    os.utime(d / source, (time.time() + 60, time.time() + 60))
    return t.rows_ok(d, argv, CORPUS_LINES, done="input touched")


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def lock(folder: Path, host: str | None, pid: int, age_s: float) -> None:
    import socket

    from distributed_scoring.io.lock import current_pid_namespace

    now = time.time()
    (folder / "_lock.json").write_text(
        json.dumps(
            {
                "host": host or socket.gethostname(),
                "pid": pid,
                "pid_namespace": current_pid_namespace(),
                "started": now - age_s - 60,
                "heartbeat": now - age_s,
                "token": "another-run",
            }
        )
    )


@case(
    "F24",
    FAULT,
    "a stale lock of a dead pid on this machine, beside a killed run; the same command",
    "taken over with a warning; exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d, KILL_LINES))
    kill_midway(t, d, argv, "out")
    lock(d / "out", None, dead_pid(), 5)
    return survived(t, d, argv, KILL_LINES, "killed after 2 shards, its lock replaced by a dead pid's", None)


@case(
    "F25",
    FAULT,
    "a lock of another host whose heartbeat is 20 minutes old; the same command",
    "the stale lock taken over with a warning (any host may: its run is gone); exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    t.call(d, *argv)
    (d / "out" / "summary.json").unlink()
    lock(d / "out", "gpu-node-7", 4242, 1200)
    call = t.call(d, *argv)
    o = t.observe(call, d, "out", CORPUS_LINES, "summary.json deleted, lock of gpu-node-7 20 min old")
    o.check("taking the folder over" in call.err, "no warning that the lock was taken over")
    o.check(not (d / "out" / "_lock.json").exists(), "the lock was left behind")
    return t.complete(o, call)


@case(
    "F26",
    FAULT,
    "a live lock of another host (heartbeat now); the same command",
    "refused in one line naming the holder; nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    (d / "out").mkdir()
    lock(d / "out", "gpu-node-7", 4242, 0)
    return t.refused(d, argv, ["gpu-node-7"], untouched=snapshot(d / "out"), done="lock of gpu-node-7")


def _full(name: str, kind: str, n: int, expected_rc: int, words: str) -> None:
    def run(t: Trial, d: Path) -> Outcome:
        argv = _score(corpus(d))
        full = t.dscore.call(argv, d, prelude=full_disk(kind, n)) if t.dscore.mode != "inline" else None
        if full is None:
            return Outcome(problems=["needs a forked command"])
        before = t.verify(d, "out") if (d / "out").exists() else "-"
        leftovers = [p.name for p in (d / "out").rglob("*.tmp")] if (d / "out").exists() else []
        rerun = t.call(d, *argv)
        o = t.observe(
            full,
            d,
            "out",
            CORPUS_LINES,
            f"{kind} write no. {n} fails with ENOSPC; verify: {before}; space freed, the same command",
        )
        t.one_line(o, full, expected_rc, [words, "No space left on device"])
        o.check(not leftovers, f"temporary files left: {leftovers}")
        if expected_rc == 1:
            o.check(before == "INCOMPLETE", f"verify after the full disk says {before}")
        after = t.observe(rerun, d, "out", CORPUS_LINES)
        o.rows_out, o.duplicates, o.verdict = after.rows_out, after.duplicates, after.verdict
        return t.complete(o, rerun)

    expected = (
        "exit 1 `dscore: incomplete` in one line, no .tmp, verify INCOMPLETE"
        if expected_rc == 1
        else "exit 2 `dscore: error` in one line, no .tmp"
    )
    case(
        name,
        FAULT,
        f"a full disk at {kind} write no. {n} (ENOSPC half-way), then the same command",
        f"{expected}; the rerun exit 0, rows in == rows out, verify OK",
    )(run)


_full("F27", "shard", 3, 1, "dscore: incomplete: the run stopped on an error while writing")
_full("F28", "marker", 2, 1, "dscore: incomplete: the run stopped on an error while writing")
_full("F29", "run file", 1, 2, "dscore: error: cannot create or write the output folder")


@case(
    "F30",
    FAULT,
    "a directory in the way of a shard's file (EISDIR), then removed and the same command",
    "exit 1 `dscore: incomplete` in one line, verify not OK; the rerun exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    t.call(d, *argv)
    (d / "out" / "_done" / f"{LAST}.json").unlink()
    obstacle = d / "out" / "rows" / f"part-{LAST}.parquet"
    obstacle.unlink()
    (obstacle / "in-the-way").mkdir(parents=True)
    failed = t.call(d, *argv)
    before = t.verify(d, "out")
    shutil.rmtree(obstacle)
    rerun = t.call(d, *argv)
    o = t.observe(failed, d, "out", CORPUS_LINES, f"verify: {before}; the directory removed, the same command")
    t.one_line(o, failed, 1, ["dscore: incomplete:", "Is a directory"])
    o.check(before in ("INCOMPLETE", "FAILED"), f"verify says {before}")
    after = t.observe(rerun, d, "out", CORPUS_LINES)
    o.rows_out, o.duplicates, o.verdict = after.rows_out, after.duplicates, after.verdict
    return t.complete(o, rerun)


# Operator mistakes (two runs into one folder, an --output that is an input, a folder of one's own files, ...)


@case(
    "O01",
    MISTAKE,
    "two rescore runs into one folder at once",
    "the second refused in one line, changing nothing; the first exit 0, its texts its own, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    first_argv = [
        "rescore",
        "--dev",
        nbest(d, "a_dev.jsonl", 6, 2, "ad"),
        "--test",
        nbest(d, "a_test.jsonl", 6, 2, "at"),
        "--model",
        M,
        "--output",
        "R",
        "--shard-rows",
        "2",
    ]
    second_argv = [
        "rescore",
        "--dev",
        nbest(d, "b_dev.jsonl", 5, 3, "bd"),
        "--test",
        nbest(d, "b_test.jsonl", 5, 3, "bt"),
        "--model",
        M,
        "--output",
        "R",
        "--shard-rows",
        "2",
    ]
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
    MISTAKE,
    "--output = an input folder: `score o/x --output o/x`",
    f"{REFUSED_LINE} into o/x",
)
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *_score(corpus(d), out="o/x"))
    return t.refused(
        d,
        ["score", "o/x", "--model", M, "--output", "o/x"],
        ["o/x"],
        out="o/x",
        untouched=snapshot(d / "o/x"),
        rows_in=CORPUS_LINES,
    )


@case("O03", MISTAKE, "the same with --overwrite", f"{REFUSED_LINE} into o/x")
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *_score(corpus(d), out="o/x"))
    return t.refused(
        d,
        ["score", "o/x", "--model", M, "--output", "o/x", "--overwrite"],
        ["o/x"],
        out="o/x",
        untouched=snapshot(d / "o/x"),
        rows_in=CORPUS_LINES,
    )


@case("O04", MISTAKE, "--output inside the input folder", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="data/c.txt")
    return t.refused(d, ["score", "data", "--model", M, "--output", "data/out"], ["data"], out="data/out")


@case("O05", MISTAKE, "an input inside the --output folder", REFUSED_LINE)
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
    MISTAKE,
    "audit into a folder of the user's own files (summary.json, report.html)",
    f"{REFUSED_LINE}: the user's files unchanged",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    return t.refused(d, ["audit", source, "--model", M, "--output", "out"], ["_run.json"], untouched=_users_folder(d))


@case(
    "O07",
    MISTAKE,
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
    case(_id, MISTAKE, f"{_command} --output ''", f"{REFUSED_LINE} in the current directory")(_empty_output(_command))


@case(
    "O12",
    MISTAKE,
    "a copied shard in rows/, then the same command",
    "exit 0 warning of it; rows out (marked shards) == rows in, no repeated id; verify FAILED naming the file",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
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
    MISTAKE,
    "--overwrite of a run folder holding the user's files in rows/ and _done/",
    "exit 0; the user's files kept; rows out == rows in; verify names the user's file in rows/ (FAILED)",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *_score(source))
    write(d, "out/rows/my-notes.txt", "keep me\n")
    write(d, "out/_done/my-notes.txt", "keep me too\n")
    call = t.call(d, *_score(source, "--overwrite", "--variant", "word_l2r"))
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
    MISTAKE,
    "score --overwrite into an audit's folder",
    "exit 0; the audit's audit.json and report.html gone; rows in == rows out; verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, "audit", source, "--model", M, "--output", "out", "--shard-rows", "4")
    had = (d / "out/audit.json").exists() and (d / "out/report.html").exists()
    o = t.rows_ok(d, _score(source, "--overwrite"), CORPUS_LINES, done="after an audit into out")
    o.check(had, "the audit wrote no audit.json/report.html")
    o.check(not (d / "out/audit.json").exists() and not (d / "out/report.html").exists(), "the audit's reports stayed")
    return o


@case(
    "O15", MISTAKE, "score into a training folder (made by train's own claim)", f"{REFUSED_LINE}, the folder unchanged"
)
def _(t: Trial, d: Path) -> Outcome:
    from distributed_scoring.config import ModelSpec
    from distributed_scoring.io.claim import claim_training
    from distributed_scoring.workflows.train.run import TRAINING_OUTPUTS, TrainOptions, training_fingerprint

    run = training_fingerprint("maskless", ModelSpec(M), TrainOptions(), {"teacher": "t"})
    with claim_training(str(d / "trained"), run, outputs=TRAINING_OUTPUTS):
        write(d, "trained/checkpoints/step-00000010/weights.bin", b"\x00" * 16)
    return t.refused(d, _score(corpus(d), out="trained"), ["trained"], out="trained", untouched=snapshot(d / "trained"))


@case("O16", MISTAKE, "a finished score folder rerun with another model", f"{REFUSED_LINE}, the folder unchanged")
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *_score(source))
    return t.refused(
        d,
        ["score", source, "--model", R, "--output", "out", "--shard-rows", "2"],
        ["--overwrite"],
        rows_in=CORPUS_LINES,
        untouched=snapshot(d / "out"),
    )


@case("O17", MISTAKE, "the same with --overwrite", "exit 0, only the new model's rows, verify OK")
def _(t: Trial, d: Path) -> Outcome:
    import pyarrow.parquet as pq

    source = corpus(d)
    t.call(d, *_score(source))
    o = t.rows_ok(
        d, ["score", source, "--model", R, "--output", "out", "--shard-rows", "2", "--overwrite"], CORPUS_LINES
    )
    summary = json.loads((d / "out/summary.json").read_text())
    o.check(summary["model"] == R, f"summary names model {summary['model']}")
    o.check(len(list((d / "out/rows").glob("*.parquet"))) == 6, "shard files of the first run remain")
    o.check(pq.read_table(d / "out/rows").num_rows == CORPUS_LINES, "rows/ reads as more rows than the run's")
    return o


@case("O18", MISTAKE, "a finished score folder rerun with another --shard-rows", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *_score(source))
    return t.clear(d, ["score", source, "--model", M, "--output", "out", "--shard-rows", "3"], CORPUS_LINES)


@case(
    "O19",
    MISTAKE,
    "two score runs into one folder at once",
    "the second refused in one line naming the holder; the first exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    lines = 8 * KILL_LINES  # long enough that the first still runs when the second has checked its model
    argv = _score(corpus(d, lines))
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


@case("O20", MISTAKE, "a finished run rerun unchanged", "exit 0, nothing rescored (files unchanged), verify OK")
def _(t: Trial, d: Path) -> Outcome:
    argv = _score(corpus(d))
    t.call(d, *argv)
    rows = snapshot(d / "out" / "rows")
    o = t.rows_ok(d, argv, CORPUS_LINES)
    o.check(snapshot(d / "out" / "rows") == rows, "shard files rewritten")
    return o


@case("O21", MISTAKE, "verify a folder of the user's own files", "exit 2 `not a run`, one line")
def _(t: Trial, d: Path) -> Outcome:
    _users_folder(d)
    call = t.call(d, "verify", "out")
    o = Outcome(command=call.shown, rc=call.rc, line=call.line, traceback=call.traceback, verdict=verdict(call))
    o.check(call.rc == 2 and not call.traceback, f"exit {call.rc}")
    o.check(len((call.out + call.err).strip().splitlines()) == 1, "not one line")
    return o


@case("O22", MISTAKE, "verify a folder that does not exist", "exit 2, one line")
def _(t: Trial, d: Path) -> Outcome:
    call = t.call(d, "verify", "nowhere")
    o = Outcome(command=call.shown, rc=call.rc, line=call.line, traceback=call.traceback, verdict=verdict(call))
    o.check(call.rc == 2 and not call.traceback, f"exit {call.rc}")
    o.check(len((call.out + call.err).strip().splitlines()) == 1, "not one line")
    return o


@case("O23", MISTAKE, "--output = the model's folder, with --overwrite", f"{REFUSED_LINE}, the model unchanged")
def _(t: Trial, d: Path) -> Outcome:
    shutil.copytree(d.parent / "_models" / "bert", d / "model")
    return t.refused(
        d,
        ["score", corpus(d), "--model", "model", "--output", "model", "--overwrite"],
        ["model"],
        out="model",
        untouched=snapshot(d / "model"),
    )


@case("O24", MISTAKE, "infill into a finished score folder", f"{REFUSED_LINE}, the folder unchanged")
def _(t: Trial, d: Path) -> Outcome:
    t.call(d, *_score(corpus(d)))
    return t.refused(
        d,
        ["infill", masked(d), "--id-column", "id", "--model", M, "--output", "out"],
        ["--overwrite"],
        rows_in=CORPUS_LINES,
        untouched=snapshot(d / "out"),
    )


@case("O25", MISTAKE, "audit --baseline pointing at a score run's summary.json, not an audit.json", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    t.call(d, *_score(source, out="scored"))
    return t.refused(
        d,
        ["audit", source, "--model", M, "--output", "out", "--baseline", "scored/summary.json"],
        ["scored/summary.json"],
    )


# Attacks


@case(
    "A01",
    ATTACK,
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


@case("A02", ATTACK, "ids with a newline, a NUL, ANSI escapes and 10,000 characters", CLEAR_LINE)
def _(t: Trial, d: Path) -> Outcome:
    ids = ["a\nb", "c\x00d", "\x1b[31mred\x1b[0m", "x" * 10000]
    source = jsonl(d, "p.jsonl", [{"id": i, "text": "a dog"} for i in ids])
    return t.clear(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], len(ids))


HTML = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def _html(where: str) -> Callable[[Trial, Path], Outcome]:
    def run(t: Trial, d: Path) -> Outcome:
        import tiny

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
    ATTACK,
    "HTML in partition names (audit report.html)",
    "exit 0, rows in == rows out, verify OK; report.html escapes it",
)(_html("partitions"))
case(
    "A04",
    ATTACK,
    "HTML in ids (audit's outliers in report.html)",
    "exit 0, rows in == rows out, verify OK; report.html escapes it",
)(_html("ids"))
case(
    "A05",
    ATTACK,
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
    ATTACK,
    "a model whose config needs its own code (auto_map)",
    f"{REFUSED_LINE}, naming --trust-remote-code; the code never runs",
)(_remote_code("config"))
case("A07", ATTACK, "a model whose tokenizer needs its own code (auto_map)", f"the code never runs: {CLEAR_LINE}")(
    _remote_code("tokenizer")
)


@case("A08", ATTACK, "--output a symlink to the input folder", f"{REFUSED_LINE}, the input unchanged")
def _(t: Trial, d: Path) -> Outcome:
    corpus(d, name="data/c.txt")
    (d / "out").symlink_to(d / "data", target_is_directory=True)
    return t.refused(
        d, ["score", "data/c.txt", "--model", M, "--output", "out"], ["out"], untouched=snapshot(d / "data"), out="data"
    )


@case("A09", ATTACK, "--output a symlink to the input file, with --overwrite", f"{REFUSED_LINE}, the input unchanged")
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    (d / "out").symlink_to(d / source)
    before = (d / source).read_bytes()
    o = t.refused(d, ["score", source, "--model", M, "--output", "out", "--overwrite"], ["out"], out=None)
    o.check((d / source).exists() and (d / source).read_bytes() == before, "the input changed")
    return o


@case(
    "A10",
    ATTACK,
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
    ATTACK,
    "shell and format strings as ids and texts ($(touch pwned), %s%n, {0.__class__})",
    "exit 0, rows in == rows out, verify OK, nothing run",
)
def _(t: Trial, d: Path) -> Outcome:
    values = ["$(touch pwned)", "`touch pwned`", "%s%n%x", "{0.__class__}", "'; DROP TABLE rows; --"]
    source = jsonl(d, "s.jsonl", [{"id": v, "text": v} for v in values])
    o = t.rows_ok(d, ["score", source, "--id-column", "id", "--model", M, "--output", "out"], len(values))
    o.check(not (d / "pwned").exists(), "a shell ran")
    return o


# Stops and checks: SIGTERM and Ctrl-C mid-run, models that cannot be masked LMs, the machine's limits.

STOPPED_LINE = (
    "exit 143 (SIGTERM) or 130 (SIGINT), one line `stopped by ...: N of M shards done; rerun ...`, no "
    "traceback, no lock left; the rerun exit 0, rows in == rows out, no repeated id, verify OK"
)


def stopped(
    t: Trial, d: Path, argv: Sequence[str], rows_in: int, signum: int, spawn: bool = False, twice: bool = False
) -> Outcome:
    """Send `signum` once 2 shards are marked (`twice`: again at once), then rerun the same command."""
    process = t.dscore.start(argv, d, spawn=spawn)
    deadline = time.monotonic() + (RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    while markers(d / "out") < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = process.poll() is None
    descendants = _descendants(process.pid)
    os.kill(process.pid, signum)
    if twice:
        time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
    call = process.wait(RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    _reap(descendants)
    name = signal.Signals(signum).name
    o = t.observe(call, d, "out", rows_in, f"{name} after 2 shards" + (", twice" if twice else ""))
    o.check(alive, "the command ended before the signal")
    o.check(call.rc == 128 + signum, f"exit {call.rc}, expected {128 + signum}")
    o.check(not call.traceback and "SIGTERM received" not in call.err, "a traceback or a crash dump")
    if not twice:  # a second signal exits at once: its line and lock are not promised
        o.check(len(call.lines) == 1 and f"stopped by {name}: " in call.line, f"the line was {call.line!r}")
        o.check(not (d / "out" / "_lock.json").exists(), "the lock was left behind")
    rerun = t.call(d, *argv, spawn=spawn)
    after = t.observe(rerun, d, "out", rows_in, o.done)
    after.problems = o.problems + after.problems
    return t.complete(after, rerun)


@case(
    "S01",
    STOP,
    "SIGTERM to `score` mid-run (what Slurm, Kubernetes, systemd send), then the same command",
    STOPPED_LINE,
)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, _score(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGTERM)


@case("S02", STOP, "Ctrl-C (SIGINT) to `score` mid-run, then the same command", STOPPED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, _score(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGINT)


@case("S03", STOP, "SIGTERM to `score --ray` mid-run, then the same command", STOPPED_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, _score(corpus(d, KILL_LINES), "--ray"), KILL_LINES, signal.SIGTERM, spawn=True)


@case("S04", STOP, "Ctrl-C to `score --ray` mid-run, then the same command", STOPPED_LINE, ray=True)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, _score(corpus(d, KILL_LINES), "--ray"), KILL_LINES, signal.SIGINT, spawn=True)


@case(
    "S05",
    STOP,
    "SIGTERM twice in a row to `score` mid-run, then the same command",
    "exit 143 at once; the rerun exit 0, rows in == rows out, no repeated id, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    return stopped(t, d, _score(corpus(d, KILL_LINES)), KILL_LINES, signal.SIGTERM, twice=True)


def _bad_model(d: Path, kind: str) -> str:
    """A model folder made from the trial's tiny BERT that cannot be used as a masked LM."""
    from transformers import BertModel, T5Config, T5ForConditionalGeneration

    good, folder = d.parent / "_models" / "bert", d / "model"
    if kind == "truncated":
        shutil.copytree(good, folder)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return "model"
    model = BertModel.from_pretrained(good) if kind.startswith("headless") else None
    if model is None:
        model = T5ForConditionalGeneration(T5Config(vocab_size=300, d_model=16, d_ff=32, num_layers=1, num_heads=2))
    model.save_pretrained(folder)
    for f in good.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, folder / f.name)
    if kind == "headless-unlabelled":  # nothing in its config says what it is: only loading the weights tells
        config = json.loads((folder / "config.json").read_text())
        config.pop("architectures", None)
        (folder / "config.json").write_text(json.dumps(config))
    return "model"


for _id, _kind, _words, _ray in (
    ("S06", "headless", "no trained masked-LM head", False),
    ("S07", "t5", "no masked-LM class", False),
    ("S08", "truncated", "are damaged", False),
    ("S09", "headless-unlabelled", "no trained masked-LM head", False),
    ("S10", "t5", "no masked-LM class", True),
    ("S11", "headless-unlabelled", "could not start: ModelLoadError", True),
):

    def _refused_model(t: Trial, d: Path, kind: str = _kind, words: str = _words, ray: bool = _ray) -> Outcome:
        model = _bad_model(d, kind)
        argv = ["score", corpus(d, 4), "--model", model, "--output", "out", *(["--ray"] if ray else [])]
        if not ray:
            return t.refused(d, argv, [words])
        call = t.call(d, *argv, spawn=True)
        o = t.observe(call, d, "out", 4)
        t.one_line(o, call, 2, [words])
        o.check(not (d / "out").exists(), "out/ was created")
        return o

    case(
        _id,
        STOP,
        f"score{' --ray' if _ray else ''} with a {_kind} model (bare BertModel, T5, half a model.safetensors; "
        "'unlabelled': a bare encoder whose config does not say so)",
        f"{REFUSED_LINE} (no folder claimed)",
        ray=_ray,
    )(_refused_model)


@case("S12", STOP, "score into a path with a 300-character folder name", REFUSED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    return t.refused(
        d, ["score", corpus(d, 4), "--model", M, "--output", "a" * 300], ["longer than the filesystem"], out=None
    )


@case("S13", STOP, "score --ray under `ulimit -n 64`", f"{REFUSED_LINE}, before Ray starts", ray=True)
def _(t: Trial, d: Path) -> Outcome:
    argv = [sys.executable, "-m", "distributed_scoring.cli", "score", corpus(d, 4), "--model", M, "--output", "out"]
    done = subprocess.run(
        [*argv, "--ray"],
        cwd=d,
        capture_output=True,
        text=True,
        timeout=RAY_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE, (64, 64)),
    )
    call = Call(argv[3:], done.returncode, done.stdout, done.stderr)
    o = t.observe(call, d, "out", 4)
    t.one_line(o, call, 2, ["open-files limit is 64"])
    o.check(not (d / "out").exists(), "out/ was created")
    return o


# The trial


@dataclass
class Result:
    id: str
    category: str
    what: str
    expected: str
    outcome: Outcome
    seconds: float

    @property
    def verdict(self) -> str:
        return "PASS" if self.outcome.passed else "FAIL"


def run_case(c: Case, trial: Trial) -> Result:
    d = trial.root / c.id
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    started = time.monotonic()
    try:
        outcome = c.run(trial, d)
    except Exception as exc:  # the trial's own failure: reported as the case's, never hidden
        outcome = Outcome(problems=[f"the trial itself failed: {type(exc).__name__}: {exc}"])
        traceback.print_exc()
    return Result(c.id, c.category, c.what, c.expected, outcome, time.monotonic() - started)


def select(ids: Sequence[str], ray: bool) -> list[Case]:
    cases = [c for c in CASES if (not ids or any(c.id.startswith(i) for i in ids)) and (ray or not c.ray)]
    assert len({c.id for c in CASES}) == len(CASES), "case ids repeat"
    return cases


def run_trial(root: Path, cases: Sequence[Case], mode: str = "fork") -> list[Result]:
    trial = Trial(root, Dscore(mode))
    root.mkdir(parents=True, exist_ok=True)
    trial.warm()
    results = []
    for n, c in enumerate(cases, start=1):
        result = run_case(c, trial)
        results.append(result)
        o = result.outcome
        print(
            f"[{n:3d}/{len(cases)}] {c.id} {result.verdict} {result.seconds:5.1f} s  {c.what}"
            + (f"\n      {'; '.join(o.problems)}" if o.problems else ""),
            flush=True,
        )
    return results


# Reporting


def counts(results: Sequence[Result]) -> dict[str, Counter]:
    table = {category: Counter() for category in CATEGORIES}
    for r in results:
        table[r.category][r.verdict] += 1
    return table


def _cell(text: object, limit: int = 220) -> str:
    text = "" if text is None else str(text)
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


COLUMNS = (
    "case",
    "category",
    "what was done",
    "command",
    "expected",
    "exit",
    "the dscore line",
    "traceback",
    "rows in / out",
    "repeated ids",
    "verify after",
    "verdict",
)


def markdown_table(results: Sequence[Result]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        o = r.outcome
        rows = "-" if o.rows_in is None and o.rows_out is None else f"{_none(o.rows_in)} / {_none(o.rows_out)}"
        what = r.what + (f" ({o.done})" if o.done else "")
        verdict = r.verdict + (": " + "; ".join(o.problems) if o.problems else "")
        cells = [
            r.id,
            r.category,
            what,
            f"`{_cell(o.command, 160)}`" if o.command else "",
            r.expected,
            _none(o.rc, "killed"),
            _cell(o.line),
            "yes" if o.traceback else "no",
            rows,
            _none(o.duplicates),
            o.verdict,
            verdict,
        ]
        lines.append("| " + " | ".join(_cell(c, 400) if i not in (3,) else c for i, c in enumerate(cells)) + " |")
    return "\n".join(lines) + "\n"


def _none(value: object, instead: str = "-") -> str:
    return instead if value is None else str(value)


def verdict_line(fails: list) -> str:
    """The report's one line on failures: none, or each failed case with its problems."""
    if not fails:
        return "Every case passed."
    return "Failed: " + ", ".join(f"{r.id} ({'; '.join(r.outcome.problems)})" for r in fails) + "."


def counts_table(results: Sequence[Result]) -> str:
    table = counts(results)
    lines = ["| category | cases | PASS | FAIL |", "|---|---|---|---|"]
    for category, c in table.items():
        lines.append(f"| {category} | {sum(c.values())} | {c['PASS']} | {c['FAIL']} |")
    total = Counter(r.verdict for r in results)
    lines.append(f"| all | {len(results)} | {total['PASS']} | {total['FAIL']} |")
    return "\n".join(lines) + "\n"


def page(results: Sequence[Result], meta: dict) -> str:
    fails = [r for r in results if r.verdict == "FAIL"]
    return f"""# Reliability: the adversarial trial

What [runs.md](runs.md) promises, tried by an operator who means harm or makes mistakes: every bad input
a clear one-line error (exit 2, no traceback) or an error row per bad row (rows in == rows out); every
fault (kill -9, damaged folders, changed inputs, locks, a full disk) survived by rerunning the same
command with rows in == rows out, no repeated id and `dscore verify` OK, and verify not OK on the
damaged folder before; every operator mistake (two runs into one folder, an `--output` that is an input
or an empty string, a folder of your own files, a copied shard, an `--overwrite` where your own files or
another command's run lie) refused in one line or survived with nothing mixed; a few attacks.
`benchmarks/adversarial.py` plays each case against the real CLI with tiny random models (nothing
downloaded) and judges what it sees; a FAIL is a promise broken, and stays in the table until the code
is fixed.

```bash
.venv/bin/python benchmarks/adversarial.py --output out/adversarial --update docs/reliability.md
.venv/bin/python benchmarks/adversarial.py --output out/adversarial --only F0 --only O12   # some cases
```

`--spawn` runs every command as `python -m distributed_scoring.cli` (by default each is forked from the
trial after the imports; the `--ray` cases always spawn), `--no-ray` leaves the Ray cases out. Each case's
folder, with the commands' standard output and error (`<case>/_logs`), stays under `--output`.

Last run: {meta["date"]}, {meta["cases"]} cases in {meta["minutes"]:.1f} min, load average {meta["load"]:.2f}
before the start on {meta["cores"]} cores, commands {meta["mode"]}ed, dscore at commit {meta["commit"]}.

{counts_table(results)}
{verdict_line(fails)}

Columns: the command judged (paths relative to the case's folder; `../_models/bert` is a tiny random BERT),
its exit code (`killed`: kill -9 by the trial), its `dscore` line(s) on standard error, whether a Python
traceback was printed, the rows the input holds and the rows of the folder's marked shards (what dscore's
readers read), the ids among them that repeat, and `dscore verify`'s verdict on the folder afterwards.

{markdown_table(results)}"""


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", required=True, help="folder of the cases' folders, adversarial.json and .md")
    parser.add_argument("--update", default=None, help="write this page (docs/reliability.md) with the table")
    parser.add_argument("--only", action="append", default=[], help="cases whose id starts with this (repeatable)")
    parser.add_argument("--spawn", action="store_true", help="every command as `python -m distributed_scoring.cli`")
    parser.add_argument("--no-ray", action="store_true", help="leave out the cases that start an embedded Ray")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = select(args.only, not args.no_ray)
    if args.list:
        for c in cases:
            print(f"{c.id}  {c.category:16}  {c.what}")
        return 0
    root = Path(args.output).resolve()
    load = os.getloadavg()[0]
    started = time.monotonic()
    mode = "spawn" if args.spawn else "fork"
    results = run_trial(root, cases, mode)
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cases": len(results),
        "minutes": (time.monotonic() - started) / 60,
        "load": load,
        "cores": os.cpu_count(),
        "mode": mode,
        "commit": git_commit(),
    }
    (root / "adversarial.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "counts": {k: dict(v) for k, v in counts(results).items()},
                "cases": [
                    {
                        **{k: v for k, v in asdict(r).items() if k != "outcome"},
                        **asdict(r.outcome),
                        "verdict": r.verdict,
                    }
                    for r in results
                ],
            },
            indent=1,
        )
    )
    (root / "adversarial.md").write_text(counts_table(results) + "\n" + markdown_table(results))
    if args.update:
        Path(args.update).write_text(page(results, meta))
    print(counts_table(results))
    return 0 if all(r.verdict == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
