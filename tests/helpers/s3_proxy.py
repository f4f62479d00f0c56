"""A counting HTTP proxy on loopback in front of an S3 server (moto's, tests/helpers/object_store.py): what an object
store sees of a run, request by request.

AWS_ENDPOINT_URL names the proxy instead of the server; the proxy forwards every request as it came (method,
target, headers, body: the signature stays valid) and the answer as it went. It counts each request
(`requests()`: "PUT /bucket/key", "GET /bucket?list-type=2&prefix=..."), can add a fixed latency to each (as a
store across a network would) and can answer 503 Service Unavailable to everything for a while, starting after
a given request (an outage of the store). It can also stand in for a store that does not keep the conditions of
requests: `strip` names headers it removes before forwarding (`CONDITIONS`: a store, or a proxy before it, that
ignores `If-None-Match`/`If-Match`), and `not_implemented` the requests it answers 501 Not Implemented
(LocalStack's answer to a DELETE with `If-Match`). Nothing is mocked: the product talks HTTP to a real S3 API.

Used by tests/io/test_s3_requests.py and benchmarks/s3_requests.py.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

# Headers that belong to one hop (the client's connection to the proxy), not to the request.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "expect", "te", "upgrade"}
UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>the store is unavailable (a test's outage)</Message></Error>"
)
NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented</Message></Error>"
)
CONDITIONS = ("If-None-Match", "If-Match")  # the headers of conditional writes (the folder lock's)


def conditional_delete(command: str, headers) -> bool:
    """A DELETE with `If-Match`: what LocalStack answers 501 to."""
    return command == "DELETE" and "If-Match" in headers


class CountingProxy:
    """The proxy: `start()` serves on 127.0.0.1 in daemon threads; `endpoint` is what AWS_ENDPOINT_URL names."""

    def __init__(
        self,
        upstream: str,
        latency_s: float = 0.0,
        strip: tuple[str, ...] = (),
        not_implemented: Callable[[str, object], bool] | None = None,
    ) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.latency_s = latency_s
        self.strip = {name.lower() for name in strip}  # headers removed from every request forwarded
        self.not_implemented = not_implemented  # (method, headers) -> answer 501 instead of forwarding
        self._seen: list[str] = []
        self._lock = threading.Lock()
        self._outage: tuple[Callable[[str], bool], int, float] | None = None  # (after which requests, n, seconds)
        self._matched = 0
        self._down_until = 0.0
        self.refused = 0  # requests answered 503 during outages
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "CountingProxy":
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def requests(self) -> list[str]:
        """Every request forwarded or refused so far: method and target."""
        with self._lock:
            return list(self._seen)

    def outage(self, seconds: float, after: Callable[[str], bool], n: int = 1) -> None:
        """Answer 503 to every request for `seconds`, from the moment the `n`-th request matching `after` (a
        predicate on "METHOD /target") has been answered."""
        with self._lock:
            self._outage, self._matched, self._down_until = (after, n, seconds), 0, 0.0

    def _admit(self, line: str) -> bool:
        """Count the request; whether it is forwarded (False: the store is down)."""
        with self._lock:
            self._seen.append(line)
            down = time.monotonic() < self._down_until
            self.refused += down
            return not down

    def _answered(self, line: str) -> None:
        with self._lock:
            if self._outage is None or not self._outage[0](line):
                return
            self._matched += 1
            if self._matched == self._outage[1]:
                self._down_until = time.monotonic() + self._outage[2]


def _handler(proxy: CountingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as clients expect of S3
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _body(self) -> bytes | None:
            """The request's body as it came, chunked framing included (the client's trailers stay intact)."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                raw = b""
                while True:
                    size_line = self.rfile.readline()
                    raw += size_line
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while True:  # trailers, then the empty line
                            trailer = self.rfile.readline()
                            raw += trailer
                            if trailer in (b"\r\n", b"\n", b""):
                                return raw
                    raw += self.rfile.read(size + 2)
            length = int(self.headers.get("Content-Length", 0) or 0)
            return self.rfile.read(length) if length else None

        def _forward(self, body: bytes | None) -> http.client.HTTPResponse:
            for attempt in (1, 2):  # once more on a fresh connection if the kept-alive one was closed
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in HOP_BY_HOP and name.lower() not in proxy.strip:
                            self.upstream.putheader(name, value)
                    self.upstream.endheaders(body)
                    return self.upstream.getresponse()
                except (http.client.HTTPException, ConnectionError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response_only(status, reason)
            length = None
            for name, value in headers:
                lowered = name.lower()
                if lowered == "content-length":
                    length = value
                elif lowered not in HOP_BY_HOP and lowered != "transfer-encoding":
                    self.send_header(name, value)
            # HEAD: the length the object would have; otherwise that of the body sent
            self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _serve(self) -> None:
            line = f"{self.command} {self.path}"
            body = self._body()
            if proxy.latency_s:
                time.sleep(proxy.latency_s)
            if not proxy._admit(line):
                self._answer(503, "Service Unavailable", [("Content-Type", "application/xml")], UNAVAILABLE)
                return
            if proxy.not_implemented is not None and proxy.not_implemented(self.command, self.headers):
                self._answer(501, "Not Implemented", [("Content-Type", "application/xml")], NOT_IMPLEMENTED)
                return
            response = self._forward(body)
            data = response.read()
            self._answer(response.status, response.reason, response.getheaders(), data)
            proxy._answered(line)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler
