"""Fixtures shared by every test folder.

AWS APIs are served by a real moto server on 127.0.0.1 (a separate HTTP server, not an in-process patch of
boto3), so the code under test talks HTTP exactly as it would to AWS.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lost_reply import LostReplyProxy, serving

REPO_ROOT = Path(__file__).resolve().parent.parent
# The CRDs of the Karpenter and KubeRay releases the stacks install (tools/crd_sources.py, SOURCES.json).
CRDS_DIR = REPO_ROOT / "tests" / "infra" / "data" / "crds"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a moto server started for this test session, with fake credentials in the environment."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {key: os.environ.get(key) for key in _AWS_ENV}
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
    )
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
)


@pytest.fixture
def moto_reset(moto_endpoint: str) -> str:
    """The moto server with all its state wiped, for a test that needs a clean account."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    return moto_endpoint


@pytest.fixture(scope="session")
def crds_dir() -> Path:
    """tests/infra/data/crds: the real KubeRay and Karpenter CRDs, copied from the pinned charts' release tags."""
    return CRDS_DIR


@pytest.fixture
def lost_reply(moto_reset: str) -> Iterator[LostReplyProxy]:
    """A proxy in front of a freshly reset moto server that lets chosen requests apply and loses their replies
    (tests/lost_reply.py); the job's S3 client talks through it for the test."""
    with serving(moto_reset) as proxy:
        yield proxy
