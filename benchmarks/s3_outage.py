"""An S3 store that stops answering for a while in the middle of an in-process `dscore score` (the
retries must ride out at least a 60-second outage at the default budget).

    .venv/bin/python benchmarks/s3_outage.py [--outage-s 65] [--rows 8]

moto's S3 server on loopback behind the counting proxy of tests/helpers/s3_proxy.py, which answers 503 to every
request for `--outage-s` seconds from the third shard file written on. Prints one JSON line: the run's exit
code and seconds, the requests refused, the summary's rows against the rows in, and `dscore verify`'s exit code.
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


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage-s", type=float, default=65.0)
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args()
    from distributed_scoring.cli import main
    from distributed_scoring.config import STORAGE_RETRY_ENV

    from helpers import tiny
    from helpers.object_store import Bucket, MotoServer
    from helpers.s3_proxy import CountingProxy

    os.environ.pop(STORAGE_RETRY_ENV, None)  # the default budget
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        server = MotoServer.start(folder / "moto.log")
        proxy = CountingProxy(server.endpoint).start()
        try:
            os.environ.update({**server.environment(), "AWS_ENDPOINT_URL": proxy.endpoint})
            bucket = Bucket.create(server)
            model = tiny.save_tiny("bert", folder / "bert")
            corpus = folder / "in.txt"
            corpus.write_text("".join(f"{tiny.CORPUS[i % len(tiny.CORPUS)]}\n" for i in range(args.rows)))
            proxy.outage(args.outage_s, after=lambda r: r.startswith("PUT ") and "/rows/part-" in r, n=3)
            began = time.monotonic()
            argv = ["score", str(corpus), "--model", str(model), "--output", bucket.uri("out"), "--shard-rows", "1"]
            with contextlib.redirect_stdout(io.StringIO()):  # the summary, printed by the command
                rc = main(argv)
            seconds = round(time.monotonic() - began, 1)
            summary = json.loads(bucket.get("out/summary.json")) if rc == 0 else {}
            figures = {
                "outage_s": args.outage_s,
                "rc": rc,
                "seconds": seconds,
                "refused_503": proxy.refused,
                "rows": summary.get("rows"),
                "rows_in": args.rows,
            }
            with contextlib.redirect_stdout(io.StringIO()):
                figures["verify_rc"] = main(["verify", bucket.uri("out")])
        finally:
            proxy.stop()
            server.stop()
    print(json.dumps(figures))


if __name__ == "__main__":
    main_()
