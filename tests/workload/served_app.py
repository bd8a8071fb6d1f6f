"""An ASGI app on a real uvicorn server on 127.0.0.1, run in a daemon thread of the test process: what the Batch API
tests' official openai clients talk to over real HTTP (test_batch_api*.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai
import uvicorn

from tests.conftest import _free_port


class ServedApp:
    """`app` served on a free port from construction until `stop()`."""

    def __init__(self, app: Any) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def client(self, key: str) -> openai.OpenAI:
        """The official client, no retries: a test sees each answer as the server gave it."""
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=key, max_retries=0)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
