"""`offline.models.build_folder`: a cached folder is built once, even by builders that start together."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from distributed_scoring.offline.models import COMPLETE, build_folder


def _build_slowly(folder: Path) -> None:
    with open(folder.parent / "builds.log", "a") as log:  # one line per build that ran
        log.write("built\n")
    time.sleep(0.5)  # long enough for the other builder to arrive while this one works
    (folder / "weights.bin").write_bytes(b"w" * 1000)


def _builder(dest: str, results) -> None:
    folder = build_folder(Path(dest), _build_slowly, "stamp")
    results.put((folder / "weights.bin").read_bytes() == b"w" * 1000 and (folder / COMPLETE).exists())


def test_builders_of_one_folder_that_start_together_build_it_once(tmp_path):
    dest = tmp_path / "models" / "m"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    builders = [context.Process(target=_builder, args=(str(dest), results)) for _ in range(3)]
    for process in builders:
        process.start()
    for process in builders:
        process.join(timeout=60)
    assert [process.exitcode for process in builders] == [0, 0, 0]
    assert [results.get(timeout=5) for _ in builders] == [True, True, True]
    assert (tmp_path / "models" / "builds.log").read_text() == "built\n"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".m.lock", "builds.log", "m"]  # no staging left


def test_a_failed_build_leaves_nothing_and_the_next_builds(tmp_path):
    dest = tmp_path / "m"

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    try:
        build_folder(dest, broken, "stamp")
    except OSError:
        pass
    assert not dest.exists() and [p.name for p in tmp_path.iterdir()] == [".m.lock"]
    assert (build_folder(dest, lambda f: (f / "ok").write_text("1"), "stamp") / "ok").read_text() == "1"
