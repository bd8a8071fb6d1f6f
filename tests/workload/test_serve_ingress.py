"""The endpoint's other request path end to end: Serve LLM's FastAPI ingress behind Serve's own proxy (no HAProxy,
no direct streaming), as the RayService on the EKS tiers runs it, with the keys in a key file (two keys: a rotation
in progress). Real Ray Serve LLM and real vLLM on the CPU with the embedded tiny model.

One endpoint start is shared by every test here; it stops gracefully (SIGTERM, exit 0) and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import _free_port
from tests.workload.serve_checks import check_no_prompt_answer_or_key_in_logs, check_the_guard
from workload.contract.serve_config import build_serve_config
from workload.leftovers import marked_processes, owner_mark

pytestmark = pytest.mark.slow

MODEL = "tiny"
# With an `engine.extra` as a user sets one: the log scan below holds with it too (the switches that would log
# prompts are refused at config load: tests/workload/test_serve_guard.py).
ENGINE = {
    "max_model_len": 1024,
    "max_num_seqs": 2,
    "enforce_eager": True,
    "cpu_kvcache_space_gib": 1,
    "extra": {"max_logprobs": 5},
}
OLD_KEY = f"sk-llmb-old-{uuid.uuid4().hex}"
NEW_KEY = f"sk-llmb-new-{uuid.uuid4().hex}"
SERVE = {"model_id": MODEL, "haproxy": False, "direct_streaming": False}


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    """The endpoint's URL, process id and log."""
    folder = tmp_path_factory.mktemp("ingress")
    keys = tmp_path_factory.mktemp("keys") / "api-keys"  # apart from the logs the test scans
    keys.write_text(f"# the key being retired, then its successor\n{OLD_KEY}\n{NEW_KEY}\n")
    keys.chmod(0o600)
    port = _free_port()
    config = folder / "serve.yaml"
    serve = {**SERVE, "api_key_file": str(keys)}
    model = {"cache_dir": str(tmp_path_factory.mktemp("cache"))}
    config.write_text(yaml.safe_dump({"model": model, "engine": ENGINE, "serve": serve}))
    log_path = folder / "serve.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "workload", "serve", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while "ready at" not in log_path.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the endpoint did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        mark = owner_mark(process.pid)
        assert marked_processes(mark), "the endpoint's processes carry no owner mark"
        yield f"http://127.0.0.1:{port}", process.pid, log_path
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, "the endpoint did not stop cleanly on SIGTERM"
        deadline = time.monotonic() + 15
        while marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not marked_processes(mark), "a gracefully stopped endpoint left processes running"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_both_keys_of_a_rotation_are_accepted(ingress: tuple[str, int, Path]) -> None:
    endpoint, _, _ = ingress
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}
    for key in (OLD_KEY, NEW_KEY):
        response = httpx.post(
            f"{endpoint}/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 3


def test_the_guard_stands_in_front_of_serves_ingress(ingress: tuple[str, int, Path]) -> None:
    endpoint, _, _ = ingress
    cap = build_serve_config({"engine": ENGINE}).max_body_bytes
    check_the_guard(endpoint, NEW_KEY, MODEL, cap)


def test_no_prompt_answer_or_key_reaches_a_log(ingress: tuple[str, int, Path]) -> None:
    endpoint, pid, log = ingress
    check_no_prompt_answer_or_key_in_logs(endpoint, pid, NEW_KEY, MODEL, log)
