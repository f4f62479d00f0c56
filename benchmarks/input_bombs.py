r"""Input bombs: small compressed files that expand to huge input, given to the real `dscore` as subprocesses, and
the peak resident memory (RSS) of each run. Issue 48 asked memory bounded by design, not by the file: about
1.5 GiB at defaults whatever the input.

    .venv/bin/python benchmarks/input_bombs.py [--line-mib 2048] [--table-mib 256] [--distinct N] [--output DIR]

- line: `dscore score` of a `.txt.gz` of three lines, the middle one 2 GiB of `a` (9.4 MB compressed). The long
  line is an error row naming the record limit (`io.sources.lines.MAX_RECORD_BYTES`); its neighbours are scored.
- table: `dscore variants` of a `.csv.gz` of `mutant` and `DMS_score` that expands to 256 MiB (1.7 MB
  compressed), 25 million short rows: the 570 single substitutions of a 30-residue wild type, then the same rows
  over and over. The first repeat (row 571) is refused with one line, exit 2, before the rest is read.
- distinct (only with --distinct N): no bomb, the cost of a table that passes its checks, which `dscore variants`
  holds whole: N distinct double and triple substitutions of the same wild type, with ProteinGym's columns,
  scored by wt-marginal (one forward pass, so the figure is the table's).

The models are the tiny ones of tests/helpers/tiny.py; torch runs on one thread. The peak RSS is the child's
own (`os.wait4`), so nothing of this process counts. Prints one JSON line per case: its size (bytes expanded; rows
for distinct), exit code, seconds, peak RSS, the last line of standard error. tests/io/test_input_bombs.py runs the
two bombs and asserts the bound.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

RSS_BOUND = 1.5 * 2**30  # what the issue asked: bytes of peak RSS at defaults, for any input
WILD = "MKTAYIAKQRQISFVKSHFSRQLEERLGLI"  # the wild type of the table bomb: 30 residues, one window of the tiny models
_RESIDUES = "ACDEFGHIKLMNPQRSTVWY"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Run:
    """What a `dscore` subprocess did."""

    code: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes
    seconds: float


def line_bomb(path: Path, line_bytes: int = 2 << 30) -> Path:
    """`a dog`, a line of `line_bytes` bytes of `a`, `the fox`, gzip level 1: the long line is never held here."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b"a dog\n")
        chunk = b"a" * _CHUNK
        for _ in range(line_bytes // _CHUNK):
            f.write(chunk)
        f.write(b"a" * (line_bytes % _CHUNK) + b"\nthe fox\n")
    return path


def table_bomb(path: Path, table_bytes: int = 256 << 20) -> Path:
    """A DMS `.csv.gz` of at least `table_bytes` bytes: every single substitution of `WILD` (570 distinct rows),
    then the same rows again until the size is reached, so the first repeat is row 571. Short rows (a mutant and
    a score) make the most rows of the size, which is what cost memory."""
    rows = []
    for i, wild in enumerate(WILD):
        for k, residue in enumerate(r for r in _RESIDUES if r != wild):
            rows.append(f"{wild}{i + 1}{residue},{-0.01 * k:.2f}\n")
    block = "".join(rows).encode()
    with gzip.open(path, "wb") as f:
        f.write(b"mutant,DMS_score\n")
        for _ in range(-(-table_bytes // len(block))):
            f.write(block)
    return path


def distinct_table(path: Path, rows: int, seed: int = 0) -> Path:
    """A ProteinGym CSV of `rows` distinct double and triple substitutions of `WILD` (random, seeded), each with
    its sequence, a score and a bin."""
    rng = random.Random(seed)
    names: set[str] = set()
    with open(path, "w") as f:
        f.write("mutant,mutated_sequence,DMS_score,DMS_score_bin\n")
        while len(names) < rows:
            sites = sorted(rng.sample(range(len(WILD)), rng.choice((2, 3))))
            residues = {i: rng.choice([r for r in _RESIDUES if r != WILD[i]]) for i in sites}
            name = ":".join(f"{WILD[i]}{i + 1}{r}" for i, r in residues.items())
            if name not in names:
                names.add(name)
                sequence = "".join(residues.get(i, w) for i, w in enumerate(WILD))
                f.write(f"{name},{sequence},{rng.gauss(-0.5 * len(sites), 1):.4f},{rng.randint(0, 1)}\n")
    return path


def measured(args: list[str], folder: Path) -> Run:
    """`dscore ARGS` in a fresh Python on one thread, its output to files in `folder` (no pipe to fill while
    waiting), and its peak RSS as the kernel counted it for that child alone (`os.wait4`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    began = time.monotonic()
    with open(folder / "stdout", "w+") as out, open(folder / "stderr", "w+") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "distributed_scoring.cli", *args], stdout=out, stderr=err, env=env
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - began
        out.seek(0)
        err.seek(0)
        return Run(process.returncode, out.read(), err.read(), usage.ru_maxrss * 1024, seconds)


def score_line_bomb(folder: Path, model: Path, line_bytes: int = 2 << 30) -> Run:
    bomb = line_bomb(folder / "bomb.txt.gz", line_bytes)
    return measured(["score", str(bomb), "--model", str(model), "--output", str(folder / "out")], folder)


def variants_table_bomb(folder: Path, model: Path, table_bytes: int = 256 << 20) -> Run:
    return _variants(table_bomb(folder / "bomb.csv.gz", table_bytes), folder, model)


def variants_distinct(folder: Path, model: Path, rows: int) -> Run:
    return _variants(distinct_table(folder / "distinct.csv", rows), folder, model)


def _variants(table: Path, folder: Path, model: Path) -> Run:
    args = ["variants", str(table), "--model", str(model), "--target-seq", WILD, "--strategy", "wt-marginal"]
    return measured([*args, "--output", str(folder / "out")], folder)


def main() -> None:
    from helpers import tiny

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line-mib", type=int, default=2048, help="the long line's size (default 2048: 2 GiB)")
    parser.add_argument("--table-mib", type=int, default=256, help="the table's size once expanded (default 256)")
    parser.add_argument("--distinct", type=int, default=0, help="also score a table of N distinct variants")
    parser.add_argument("--output", type=Path, default=None, help="a folder for the bombs (default: a temporary one)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.output or Path(scratch)
        cases = [
            ("line", score_line_bomb, options.line_mib << 20, lambda f: tiny.save_tiny("bert", f)),
            ("table", variants_table_bomb, options.table_mib << 20, lambda f: tiny.save_tiny_protein(f, "bert")),
            ("distinct", variants_distinct, options.distinct, lambda f: tiny.save_tiny_protein(f, "bert")),
        ]
        for name, run_case, size, model in cases[: 3 if options.distinct else 2]:
            place = folder / name
            place.mkdir(parents=True, exist_ok=True)
            load = os.getloadavg()[0]
            run = run_case(place, model(place / "model"), size)
            last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
            print(
                json.dumps(
                    {
                        "case": name,
                        "size": size,
                        "exit": run.code,
                        "seconds": round(run.seconds, 1),
                        "peak_rss_mib": round(run.peak_rss / 2**20),
                        "within_bound": run.peak_rss <= RSS_BOUND,
                        "load_before": load,
                        "stderr_last_line": last[:300],
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
