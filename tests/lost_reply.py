"""A proxy in front of the moto server that lets chosen requests apply and then loses their replies.

What a read timeout or a connection reset looks like to a client: the request reached S3 and changed it, but no
answer came back. botocore then retries the very same request (the same If-Match / If-None-Match condition), and
the retry finds the state its own first try made: a 412 on a conditional write, a 404 on a conditional delete.
Code that reads that answer as "someone else wrote" stops a healthy job; these tests drive every conditional write
path through this proxy to prove it does not.

The proxy is a plain HTTP forwarder (moto stays the real S3-speaking server; nothing is mocked): each request is
sent on to moto whole, and moto's answer is passed back, except for requests a rule picks, whose answer is
dropped by closing the client's connection without a byte. A rule fires a set number of times, so the retry gets
its answer.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Seen:
    """One request as it reached the proxy."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class _Rule:
    matches: Callable[[Seen], bool]
    times: int
    after: int = 0  # matching requests still to pass before the rule fires
    forward: bool = True  # False: the request never reaches upstream (a connection reset on the way there)


@dataclass
class LostReplyProxy:
    """Forwards to `upstream`; `lose(...)` arms a rule. `dropped` lists the requests whose replies were lost."""

    upstream: str
    url: str = ""
    dropped: list[Seen] = field(default_factory=list)
    _rules: list[_Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def lose(
        self,
        method: str,
        path_contains: str,
        *,
        header: str | None = None,
        value: str | None = None,
        times: int = 1,
        after: int = 0,
        forward: bool = True,
    ) -> None:
        """Lose the reply of the next `times` requests with this method whose path contains `path_contains` (and,
        if `header` is given, that carry that header, e.g. "If-Match" to pick the conditional write only; with
        `value`, that header set to it, e.g. X-Amz-Target's operation for a JSON API such as Step Functions), once
        `after` such requests have passed (to pick a later write of a file written several times). `forward`
        False: the request itself is lost on its way, so it never applies."""

        def matches(seen: Seen) -> bool:
            if seen.method != method or path_contains not in seen.path:
                return False
            found = seen.headers.get(header.lower()) if header is not None else ""
            return found is not None and (value is None or found == value)

        with self._lock:
            self._rules.append(_Rule(matches, times, after, forward))

    def _should_drop(self, seen: Seen) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.times > 0 and rule.matches(seen):
                    if rule.after > 0:
                        rule.after -= 1
                        continue
                    rule.times -= 1
                    self.dropped.append(seen)
                    return rule
        return None

    def armed(self) -> int:
        """How many losses are still to happen (a test asserts 0: its request really went through the proxy)."""
        with self._lock:
            return sum(rule.times for rule in self._rules)


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers (e.g. aws-chunked checksums) end at an empty line
                return bytes(body)
            body += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _handler(proxy: LostReplyProxy) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # the tests need no access log
            pass

        def _forward(self) -> None:
            body = _read_body(self)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in {"transfer-encoding", "expect"}}
            if body or "Content-Length" in headers or self.headers.get("Transfer-Encoding"):
                headers["Content-Length"] = str(len(body))
            seen = Seen(self.command, self.path, {k.lower(): v for k, v in headers.items()})
            dropped = proxy._should_drop(seen)
            if dropped is not None and not dropped.forward:  # lost on its way: nothing applies upstream
                self.close_connection = True
                return
            connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
            finally:
                connection.close()
            if dropped is not None:
                # The request has applied upstream; the client sees its connection close with no reply.
                self.close_connection = True
                return
            self.send_response_only(answer.status, answer.reason)
            # A HEAD's Content-Length is the object's size, not its (empty) payload's: pass it on as moto sent it.
            kept = {"transfer-encoding", "connection"} | ({"content-length"} if self.command != "HEAD" else set())
            for name, value in answer.getheaders():
                if name.lower() not in kept:
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


def start(upstream: str) -> tuple[LostReplyProxy, ThreadingHTTPServer]:
    proxy = LostReplyProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: the fixture's shutdown waits for it (0.5 s by default, in every test that uses the proxy).
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return proxy, server


@contextlib.contextmanager
def serving(upstream: str) -> Iterator[LostReplyProxy]:
    """A lost-reply proxy in front of `upstream` for the block; the job's S3 client (workload.files.storage) is
    pointed at it meanwhile. A test that builds its own client passes `endpoint_url=proxy.url`."""
    from workload.files import storage

    proxy, server = start(upstream)
    saved = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = proxy.url
    storage.s3_client.cache_clear()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        if saved is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = saved
        storage.s3_client.cache_clear()
