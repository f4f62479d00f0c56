"""What a case of the adversarial trial sees and how it is judged against what docs/runs.md promises: the
exit code, the one `dscore` line on standard error and whether a traceback came with it, rows in against
rows out and repeated ids (read from the marked shards, as dscore's readers read a folder), and `dscore
verify`'s verdict on the folder afterwards. A case passes when all of that is what docs/runs.md says; a
failed case keeps its reasons (`Outcome.problems`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from helpers import tiny
from helpers.trial.dscore import Call, Dscore

DUPLICATE_KEYS = ("construction", "sequence", "chain", "epoch", "line")  # with `id`, a row's key where present


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


class Trial:
    """What every case needs: the runner, the tiny models, the checks docs/runs.md promises."""

    def __init__(self, root: Path, dscore: Dscore) -> None:
        self.root = root
        self.dscore = dscore
        self.models = root / "_models"

    def model(self, family: str = "bert") -> str:
        folder = self.models / family
        if not (folder / "config.json").exists():
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


def markers(folder: Path) -> int:
    return len(list((folder / "_done").glob("*.json"))) if (folder / "_done").is_dir() else 0
