"""Requests an object store sees from a run: `dscore score` of N one-row shards into an s3 folder on moto's S3
server (loopback), then a rerun of the finished run and `dscore verify`, each counted from the server's own
request log (one line per HTTP request).

    .venv/bin/python benchmarks/s3_requests.py --shards 100 [--json out.json]

Prints requests per shard written, and the requests and seconds of the rerun and of verify. The tiny BERT of
tests/tiny.py scores; the input is a local text file, so every request counted is the output folder's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def requests_since(log: Path, start: int) -> list[str]:
    """The request lines the server logged after line `start` (`"PUT /bucket/key HTTP/1.1"`)."""
    time.sleep(0.3)  # the server logs a request after answering it
    return [line.split('"')[1] for line in log.read_text().splitlines()[start:] if '"' in line]


def measure(shards: int, folder: Path) -> dict:
    from distributed_scoring.cli import main

    import tiny
    from object_store import Bucket, MotoServer

    log = folder / "moto.log"
    server = MotoServer.start(log)
    try:
        os.environ.update(server.environment())
        bucket = Bucket.create(server)
        corpus = folder / "in.txt"
        corpus.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(shards)))
        model = tiny.save_tiny("bert", folder / "bert")
        argv = ["score", str(corpus), "--model", str(model), "--output", bucket.uri("out"), "--shard-rows", "1"]
        figures = {"shards": shards}
        for step, args in (("run", argv), ("rerun", argv), ("verify", ["verify", bucket.uri("out")])):
            start = len(log.read_text().splitlines())
            began = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(args)
            seconds = time.monotonic() - began
            seen = requests_since(log, start)
            figures[step] = {"rc": rc, "requests": len(seen), "seconds": round(seconds, 2)}
            figures[step]["by_kind"] = {}
            for line in seen:
                kind = line.split()[0] + (" ?" + line.split("?")[1].split("=")[0] if "?" in line else "")
                figures[step]["by_kind"][kind] = figures[step]["by_kind"].get(kind, 0) + 1
        figures["requests_per_shard"] = round(figures["run"]["requests"] / shards, 2)
        return figures
    finally:
        server.stop()


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(args.shards, Path(folder))
    figures["load_average"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main_()
