r"""What a stop loses with the default shards: `dscore score` of the demo's antibody chains (AntiBERTy, the
demo model) stopped by SIGINT at `--stop-at` seconds, then rerun to the end. Issue 51 asked that a stop on a
small slow file lose at most about a minute of this machine's work; at 1,000 rows a shard it lost everything
("0 of 1 shards done").

    .venv/bin/python benchmarks/stop_loss.py [--rows 60] [--stop-at 20] [--threads 2] [--ray] [--output DIR]

The shards are the plan's own (`pipeline.sizing`: cut by estimated work, recorded in `_run.json`). Each
finished shard's marker is written when its rows are, so the markers' times give each shard's scoring time
(the gaps between them; the first from the model's load) and the work lost: the time from the last marker
before the stop (or from the load) to the stop. Prints one JSON object: the shard sizes the plan chose, its
estimate per shard, the measured seconds per shard, shards done at the stop, seconds lost, and whether the
rerun resumed (finished the other shards only) and ended with every row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOADED = re.compile(r"^(\S+ \S+) INFO \S+: model loaded", re.M)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60, help="chains scored (the demo corpus, 3 groups)")
    parser.add_argument("--stop-at", type=float, default=20.0, help="seconds after the start to send SIGINT")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the run")
    parser.add_argument("--ray", action="store_true", help="score on an embedded Ray")
    parser.add_argument("--output", help="folder for the corpus and the run (default: a temporary one)")
    args = parser.parse_args(argv)

    from distributed_scoring.offline.antibodies import demo_corpus
    from distributed_scoring.offline.models import fetch_model
    from distributed_scoring.pipeline.sizing import SHARD_SECONDS

    folder = Path(args.output or tempfile.mkdtemp(prefix="stop_loss_"))
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "chains.txt"
    corpus.write_text("".join(r["text"] + "\n" for r in list(demo_corpus(args.rows // 3 + 1))[: args.rows]))
    out = folder / "run"
    command = [
        sys.executable,
        "-m",
        "distributed_scoring",
        "score",
        str(corpus),
        "--model",
        str(fetch_model("antiberty")),
    ]
    command += ["--output", str(out), "--overwrite", *(["--ray"] if args.ray else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}

    started = time.time()
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    time.sleep(max(0.0, started + args.stop_at - time.time()))
    stopped_at = time.time()
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)

    run = json.loads((out / "_run.json").read_text())
    loaded = LOADED.search(stderr)
    load_time = _when(loaded) if loaded else started
    marks = sorted(p.stat().st_mtime for p in (out / "_done").glob("*.json") if p.stat().st_mtime <= stopped_at)
    gaps = [b - a for a, b in zip([load_time, *marks], marks)]
    cost = run.get("shard_cost")

    rerun_started = time.time()
    again = [c for c in command if c != "--overwrite"]  # the same command: it resumes
    rerun = subprocess.run(again, env=env, capture_output=True, text=True, cwd=ROOT)
    resumed = re.search(r"resuming: (\d+) of (\d+) shards already done", rerun.stderr)
    reloaded = LOADED.search(rerun.stderr)
    rerun_marks = sorted(p.stat().st_mtime for p in (out / "_done").glob("*.json") if p.stat().st_mtime > stopped_at)
    rerun_start = _when(reloaded) if reloaded else rerun_started
    rerun_gaps = [b - a for a, b in zip([rerun_start, *rerun_marks], rerun_marks)]
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    print(
        json.dumps(
            {
                "rows": args.rows,
                "threads": args.threads,
                "ray": args.ray,
                "stop_at_s": args.stop_at,
                "exit_code": child.returncode,
                "shard_rows": sorted(run["shards"].values()),
                "budget_s_per_shard": SHARD_SECONDS if cost else None,
                "bytes_per_token": cost["bytes_per_token"] if cost else None,
                "shards_done_at_stop": len(marks),
                "shards": len(run["shards"]),
                "scoring_s_per_shard": [round(g, 1) for g in gaps],
                "lost_s": round(stopped_at - max([load_time, *marks]), 1),
                "rerun_resumed": resumed.group(0) if resumed else None,
                "rerun_s": round(time.time() - rerun_started, 1),
                "rerun_scoring_s_per_shard": [round(g, 1) for g in rerun_gaps],
                "rerun_exit_code": rerun.returncode,
                "rows_out": summary.get("rows"),
            }
        )
    )
    return 0


def _when(logged: re.Match) -> float:
    """The time of a log line matched by `LOADED`."""
    return datetime.strptime(logged.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


if __name__ == "__main__":
    sys.exit(main())
