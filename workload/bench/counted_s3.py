"""A moto S3 server that counts what the job asks of it: the scale profile's input on S3, and its reads measured.

moto is the real S3-speaking server (the test suite's); a WSGI layer in front of it tallies every request by method
and kind (an object GET, a HEAD, a listing) and the bytes of the object GETs' bodies. The job runs against it through
AWS_ENDPOINT_URL, as it runs against S3, so the figures are the job's own requests: the plan, the id pass, the
main stream's reads, from the driver and every Ray worker alike.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

BUCKET = "llmb-scale"


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.get_bytes = 0

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {**dict(self.requests), "object_get_bytes": self.get_bytes}

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.get_bytes = 0


def _kind(environ: dict[str, Any]) -> str:
    method = environ.get("REQUEST_METHOD", "")
    path = environ.get("PATH_INFO", "").strip("/")
    query = environ.get("QUERY_STRING", "")
    on_object = "/" in path  # path-style: bucket/key
    if method == "GET" and on_object and "uploadId" not in query:
        return "object_get"
    if method == "HEAD" and on_object:
        return "object_head"
    if method == "GET" and not on_object and ("list-type" in query or "versions" in query or not query):
        return "list"
    return f"other_{method.lower()}"


class _Counting:
    """WSGI middleware: counts the request, and the body bytes of an object GET as moto streams them."""

    def __init__(self, app: Any, tally: _Tally) -> None:
        self.app, self.tally = app, tally

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        kind = _kind(environ)
        with self.tally.lock:
            self.tally.requests[kind] += 1
        body = self.app(environ, start_response)
        if kind != "object_get":
            return body
        return self._counted(body)

    def _counted(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in body:
                with self.tally.lock:
                    self.tally.get_bytes += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


class CountedS3:
    """A running counted moto server: `env` for the job, `upload` for the input, `take()` for the counts so far."""

    def __init__(self, url: str, tally: _Tally) -> None:
        self.url, self._tally = url, tally

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file of `folder` under s3://BUCKET/prefix/; returns that URI. The upload's requests are not counted."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", **_keys(self.env))
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=BUCKET)
        for path in sorted(folder.iterdir()):
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
        self._tally.reset()
        return f"s3://{BUCKET}/{prefix}/"

    def take(self) -> dict[str, int]:
        """The counts since the last take (or upload), and a fresh start."""
        counts = self._tally.snapshot()
        self._tally.reset()
        return counts


def _keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "aws_session_token": env["AWS_SESSION_TOKEN"],
    }


@contextlib.contextmanager
def counted_s3() -> Iterator[CountedS3]:
    """A moto server on a free port of 127.0.0.1, counting, for the length of the block."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from moto.server import MotoRequestHandler
    from werkzeug.serving import make_server

    class _Quiet(MotoRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            """A line per request would bury the benchmark's own progress lines."""

    tally = _Tally()
    app = _Counting(DomainDispatcherApplication(create_backend_app), tally)
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="llmb-counted-s3", daemon=True)
    thread.start()
    try:
        yield CountedS3(f"http://127.0.0.1:{server.server_address[1]}", tally)
    finally:
        server.shutdown()
        thread.join(timeout=10)
