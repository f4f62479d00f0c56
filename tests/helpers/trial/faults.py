"""The trial's faults: kill -9 mid-run (of each command, and on an embedded Ray), damaged folders, changed
inputs, stale and live locks, a full disk. Each is survived by rerunning the same command, with rows in ==
rows out, no repeated id and `dscore verify` OK, and verify not OK on the damaged folder before; or refused in
one line where the folder no longer holds the run it names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from helpers import tiny
from helpers.trial.cases import (
    CORPUS_LINES,
    FAULT,
    KILL_LINES,
    MASKED,
    Cases,
    M,
    corpus,
    distinct_texts,
    jsonl,
    masked,
    rescore_argv,
    score_argv,
)
from helpers.trial.dscore import RAY_TIMEOUT_S, TIMEOUT_S, Call, descendants_of, full_disk, reap
from helpers.trial.judge import Outcome, Trial, markers, snapshot

CASES = Cases(FAULT)
case = CASES.add

SURVIVED_LINE = "verify before the rerun not OK; the rerun exit 0, rows in == rows out, no repeated id, verify OK"


def kill_midway(t: Trial, d: Path, argv: Sequence[str], folder: str, at_least: int = 2, spawn: bool = False) -> Call:
    """Start the command, kill -9 its driver once `at_least` shards are marked in `folder`."""
    process = t.dscore.start(argv, d, spawn=spawn)
    deadline = time.monotonic() + (RAY_TIMEOUT_S if spawn else TIMEOUT_S)
    while markers(d / folder) < at_least and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = process.poll() is None
    descendants = descendants_of(process.pid)
    process.kill()
    reap(descendants)
    call = process.call()
    if not alive:
        call.err += "\n(trial: the command ended before the kill)"
    return call


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


@case("F01", "kill -9 of the driver mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES))
    killed = kill_midway(t, d, argv, "out")
    return survived(t, d, argv, KILL_LINES, "killed after 2 of 12 shards", None, killed=killed)


@case("F02", "kill -9 of the driver twice, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES))
    kill_midway(t, d, argv, "out", 2)
    killed = kill_midway(t, d, argv, "out", 6)
    return survived(t, d, argv, KILL_LINES, "killed after 2, then after 6 of 12 shards", None, killed=killed)


@case("F03", "kill -9 of `audit` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
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


@case("F04", "kill -9 of `infill` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    source = masked(d, rows=[(f"r{i}", MASKED[i % len(MASKED)]) for i in range(KILL_LINES)])
    argv = ["infill", source, "--id-column", "id", "--beam", "2", "--model", M, "--output", "out", "--shard-rows", "2"]
    killed = kill_midway(t, d, argv, "out")
    return survived(t, d, argv, KILL_LINES, "killed after 2 of 12 shards", None, killed=killed)


@case("F05", "kill -9 of `sample` mid-run, then the same command", SURVIVED_LINE)
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


@case("F06", "kill -9 of `rescore` mid-run, then the same command", SURVIVED_LINE)
def _(t: Trial, d: Path) -> Outcome:
    argv = rescore_argv(d, 6, 2)
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
    "kill -9 of the driver mid-run on an embedded Ray (`--ray`), then the same command",
    SURVIVED_LINE,
    ray=True,
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES), "--ray", "--num-actors", "1", "--stall-timeout", "300")
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
        argv = score_argv(corpus(d), *extra)
        return survived(t, d, argv, CORPUS_LINES, what, lambda: damage(d / "out"), spawn=ray)

    case(name, f"{what} of a finished run, verify, the same command", SURVIVED_LINE, ray=ray)(run)


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
    "delete _run.json of a finished run, verify, the same command",
    "verify not OK; the rerun refused in one line (the folder holds no run), nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    return run_file_damaged(t, d, Path.unlink)


@case(
    "F20",
    "garbage in _run.json of a finished run, verify, the same command",
    "verify not OK; the rerun refused in one line, nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    return run_file_damaged(t, d, lambda run_file: run_file.write_text("{garbage"))


@case(
    "F21",
    "kill -9 mid-run, edit a scored line of the input, the same command; then --overwrite",
    "the rerun refused in one line naming the file and shard; --overwrite completes, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d, KILL_LINES)
    argv = score_argv(source)
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
    "append lines to the input of a finished run, the same command",
    "refused in one line (a different run: --overwrite or another --output), nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    argv = score_argv(source)
    t.call(d, *argv)
    with (d / source).open("a") as f:
        f.write("One more line.\n")
    return t.refused(d, argv, [source], rows_in=CORPUS_LINES, untouched=snapshot(d / "out"), done="1 line appended")


@case(
    "F23",
    "touch the input of a finished run (mtime only), the same command",
    "exit 0, nothing scored again, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    source = corpus(d)
    argv = score_argv(source)
    t.call(d, *argv)
    os.utime(d / source, (time.time() + 60, time.time() + 60))
    return t.rows_ok(d, argv, CORPUS_LINES, done="input touched")


def run_file_damaged(t: Trial, d: Path, damage: Callable[[Path], object]) -> Outcome:
    """A finished score run whose _run.json `damage` then spoils: verify must not say OK, and the same command
    must be refused in one line naming _run.json, changing nothing."""
    argv = score_argv(corpus(d))
    t.call(d, *argv)
    damage(d / "out" / "_run.json")
    before = t.verify(d, "out")
    o = t.refused(
        d, argv, ["_run.json"], rows_in=CORPUS_LINES, untouched=snapshot(d / "out"), done=f"verify before: {before}"
    )
    o.check(before != "OK", f"verify before the rerun says {before}")
    return o


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
    "a stale lock of a dead pid on this machine, beside a killed run; the same command",
    "taken over with a warning; exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d, KILL_LINES))
    kill_midway(t, d, argv, "out")
    lock(d / "out", None, dead_pid(), 5)
    return survived(t, d, argv, KILL_LINES, "killed after 2 shards, its lock replaced by a dead pid's", None)


@case(
    "F25",
    "a lock of another host whose heartbeat is 20 minutes old; the same command",
    "the stale lock taken over with a warning (any host may: its run is gone); exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d))
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
    "a live lock of another host (heartbeat now); the same command",
    "refused in one line naming the holder; nothing changed",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d))
    (d / "out").mkdir()
    lock(d / "out", "gpu-node-7", 4242, 0)
    return t.refused(d, argv, ["gpu-node-7"], untouched=snapshot(d / "out"), done="lock of gpu-node-7")


def _full(name: str, kind: str, n: int, expected_rc: int, words: str) -> None:
    def run(t: Trial, d: Path) -> Outcome:
        argv = score_argv(corpus(d))
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
        f"a full disk at {kind} write no. {n} (ENOSPC half-way), then the same command",
        f"{expected}; the rerun exit 0, rows in == rows out, verify OK",
    )(run)


_full("F27", "shard", 3, 1, "dscore: incomplete: the run stopped on an error while writing")
_full("F28", "marker", 2, 1, "dscore: incomplete: the run stopped on an error while writing")
_full("F29", "run file", 1, 2, "dscore: error: cannot create or write the output folder")


@case(
    "F30",
    "a directory in the way of a shard's file (EISDIR), then removed and the same command",
    "exit 1 `dscore: incomplete` in one line, verify not OK; the rerun exit 0, rows in == rows out, verify OK",
)
def _(t: Trial, d: Path) -> Outcome:
    argv = score_argv(corpus(d))
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
