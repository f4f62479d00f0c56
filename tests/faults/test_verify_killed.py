"""`dscore verify` on the folder of a killed run: INCOMPLETE (rerun the same command), not FAILED.

kill -9 leaves shards not done, the lock of a process that is gone and, when it lands while a shard's file or
marker is written, that write's temporary file, which the rerun removes. verify used to say FAILED of
that temporary file, as if the folder were damaged.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from distributed_scoring.cli import main
from distributed_scoring.io.lock import Holder, current_pid_namespace

from helpers import tiny


def corpus(folder: Path, lines: int) -> Path:
    path = folder / "many.txt"
    path.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(lines)))
    return path


def score_args(folder: Path, model: str, lines: int, shard_rows: int) -> list[str]:
    out = folder / "out"
    return [
        "score",
        str(corpus(folder, lines)),
        "--model",
        model,
        "--output",
        str(out),
        "--shard-rows",
        str(shard_rows),
    ]


def verdict(folder: Path, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(["verify", str(folder)])
    return rc, capsys.readouterr().out.strip().splitlines()


def gone_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def test_the_folder_of_a_run_killed_while_writing_a_shard_is_incomplete(tmp_path, tiny_model_dir, capsys):
    """The state kill -9 leaves in the middle of a shard's write, made exactly: the last shards not done, the
    cut-off write's temporary file in rows/ (and one in _done/), the lock of a pid that is gone."""
    args = score_args(tmp_path, str(tiny_model_dir("bert")), lines=12, shard_rows=4)
    out = tmp_path / "out"
    assert main(args) == 0
    last = sorted((out / "_done").glob("*.json"))[-1]
    (out / "rows" / f"part-{last.stem}.parquet").rename(out / "rows" / f".part-{last.stem}.parquet.0a1b.tmp")
    shutil.copy(last, out / "_done" / f".{last.name}.0a1b.tmp")
    last.unlink()
    (out / "summary.json").unlink()
    heartbeat = time.time()
    holder = Holder(socket.gethostname(), gone_pid(), current_pid_namespace(), heartbeat, heartbeat, "x")
    (out / "_lock.json").write_bytes(holder.encoded())
    rc, lines = verdict(out, capsys)
    assert rc == 1 and lines[-1].startswith(f"INCOMPLETE: {out}: 2 of 3 shards done"), lines
    assert "rerun the same command" in lines[-1]
    assert any(f"shard {last.stem}" in line and "not done" in line for line in lines), lines
    assert sum("temporary file" in line and "the rerun removes it" in line for line in lines) == 2, lines
    assert main(args) == 0  # the rerun takes the lock over, removes the temporary files and finishes
    rc, lines = verdict(out, capsys)
    assert rc == 0 and lines == [f"OK: {out}: 3 shards, 12 rows"], lines


def test_a_temporary_file_in_a_finished_folder_is_still_damage(tmp_path, tiny_model_dir, capsys):
    """No run that finished leaves one: there it fails the folder, as before."""
    args = score_args(tmp_path, str(tiny_model_dir("bert")), lines=8, shard_rows=4)
    out = tmp_path / "out"
    assert main(args) == 0
    (out / "rows" / ".part-x.parquet.1.tmp").write_text("x")
    rc, lines = verdict(out, capsys)
    assert rc == 1 and lines[-1].startswith(f"FAILED: {out}") and any("temporary file" in x for x in lines), lines


def test_a_run_killed_by_sigkill_is_incomplete_and_the_same_command_finishes_it(tmp_path, tiny_model_dir, capsys):
    lines_in = 60
    args = score_args(tmp_path, str(tiny_model_dir("bert")), lines=lines_in, shard_rows=1)
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "distributed_scoring.cli", *args], stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while driver.poll() is None and time.time() < deadline and len(list((out / "_done").glob("*.json"))) < 5:
        time.sleep(0.02)
    assert driver.poll() is None, "the run ended before it could be killed"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    rc, lines = verdict(out, capsys)
    assert rc == 1 and lines[-1].startswith(f"INCOMPLETE: {out}"), lines
    assert any("_lock.json was left by" in line for line in lines), lines
    assert main(args) == 0
    rc, lines = verdict(out, capsys)
    assert rc == 0 and lines == [f"OK: {out}: {lines_in} shards, {lines_in} rows"], lines
