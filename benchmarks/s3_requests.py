"""Requests an object store sees from a run: `dscore score` of N one-row shards into an s3 folder on moto's S3 server
(loopback), then a rerun of the finished run and `dscore verify`, each counted by a proxy in front of the server
(tests/helpers/s3_proxy.py), which can add a fixed latency to every request, as a store across a network would.

    .venv/bin/python benchmarks/s3_requests.py --shards 1000 --latency-ms 0 25 [--json out.json]

Prints, per latency, requests per shard written, and the requests and seconds of the run, of the rerun and of
verify, with the load average (/proc/loadavg) before each step. The tiny BERT of tests/helpers/tiny.py scores; the input
is a local text file, so every request counted is the output folder's. To measure another version of the
package, put its folder first on PYTHONPATH (the script prints which package it imported).
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


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def kinds(seen: list[str]) -> dict[str, int]:
    """Requests by method and, for a listing or a multipart step, its first query parameter."""
    counted: dict[str, int] = {}
    for line in seen:
        method, target = line.split(" ", 1)
        query = target.split("?", 1)[1].split("=")[0].split("&")[0] if "?" in target else ""
        kind = f"{method} ?{query}" if query else method
        counted[kind] = counted.get(kind, 0) + 1
    return dict(sorted(counted.items()))


def measure(server, shards: int, latency_ms: float, folder: Path, model: Path) -> dict:
    """One run, its rerun and verify through a proxy adding `latency_ms` to each request, into a fresh bucket."""
    from distributed_scoring.cli import main

    from helpers import tiny
    from helpers.object_store import Bucket
    from helpers.s3_proxy import CountingProxy

    proxy = CountingProxy(server.endpoint, latency_ms / 1000).start()
    try:
        os.environ.update({**server.environment(), "AWS_ENDPOINT_URL": proxy.endpoint})
        bucket = Bucket.create(server)
        corpus = folder / f"in-{shards}.txt"
        corpus.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(shards)))
        argv = ["score", str(corpus), "--model", str(model), "--output", bucket.uri("out"), "--shard-rows", "1"]
        figures: dict = {"shards": shards, "latency_ms": latency_ms}
        for step, args in (("run", argv), ("rerun", argv), ("verify", ["verify", bucket.uri("out")])):
            start = len(proxy.requests())
            figures[step] = {"load_average": load_average()}
            began = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(args)
            seen = proxy.requests()[start:]
            figures[step].update(rc=rc, requests=len(seen), seconds=round(time.monotonic() - began, 2))
            figures[step]["by_kind"] = kinds(seen)
        figures["requests_per_shard"] = round(figures["run"]["requests"] / shards, 2)
        return figures
    finally:
        proxy.stop()


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 25.0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import distributed_scoring

    from helpers import tiny
    from helpers.object_store import MotoServer

    results = {"package": str(Path(distributed_scoring.__file__).parent), "runs": []}
    print(f"package: {results['package']}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        server = MotoServer.start(folder / "moto.log")
        try:
            model = tiny.save_tiny("bert", folder / "bert")
            for latency in args.latency_ms:
                figures = measure(server, args.shards, latency, folder, model)
                print(json.dumps(figures), file=sys.stderr)
                results["runs"].append(figures)
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main_()
