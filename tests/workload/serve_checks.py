"""Checks both request paths' real endpoints share (tests/workload/test_serve_endpoint.py, test_serve_ingress.py):
the guard in front of the app, and what the endpoint's processes write to their logs."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx

from workload.leftovers import marked_processes, owner_mark

# Routes vLLM's own server (direct streaming) or Serve LLM's ingress would answer without the guard.
UNSERVED_ROUTES = (
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/metrics"),
    ("POST", "/invocations"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/v1/embeddings"),
    ("GET", "/health"),
)


def check_the_guard(endpoint: str, key: str, model: str, max_body_bytes: int) -> None:
    """401 without a known key, 404 beyond the OpenAI routes, 413 above the body cap, no CORS; health is open."""
    auth = {"Authorization": f"Bearer {key}"}
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/docs")):
            response = httpx.request(method, f"{endpoint}{path}", json=chat, headers=headers, timeout=60)
            assert response.status_code == 401, (path, response.text)
            assert response.json()["error"]["type"] == "invalid_request_error"
    for method, path in UNSERVED_ROUTES:
        response = httpx.request(method, f"{endpoint}{path}", json={}, headers=auth, timeout=60)
        assert response.status_code == 404, (path, response.status_code, response.text[:200])
    assert httpx.get(f"{endpoint}/v1/models/{model}", headers=auth, timeout=60).status_code == 200
    oversized = b'{"model": "x", "prompt": "' + b"a" * max_body_bytes + b'"}'
    response = httpx.post(
        f"{endpoint}/v1/completions",
        content=oversized,
        headers={**auth, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413, response.text[:200]
    answer = httpx.post(
        f"{endpoint}/v1/chat/completions", json=chat, headers={**auth, "Origin": "https://elsewhere.example"}
    )
    assert answer.status_code == 200, answer.text
    assert "access-control-allow-origin" not in answer.headers, answer.headers
    # The health route KubeRay and HAProxy call is answered before the app: no key needed.
    assert httpx.get(f"{endpoint}/-/healthz", timeout=30).status_code == 200


def session_folders(pid: int) -> list[Path]:
    """The folders the endpoint `pid`'s processes write to: Ray's (its session's TMPDIR's parent holds Ray's logs)
    and HAProxy's (its std streams' files). Read from a child's environment: the endpoint set them after its exec."""
    folders: set[Path] = set()
    for child in marked_processes(owner_mark(pid)):
        try:
            variables = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for variable in variables:
            name, _, value = variable.decode(errors="replace").partition("=")
            if name == "TMPDIR":
                folders.add(Path(value).parent)
            elif name == "RAY_SERVE_HAPROXY_SERVER_STATE_BASE":
                folders.add(Path(value))
    return sorted(folders)


def files_containing(folders: list[Path], needles: list[str]) -> list[str]:
    """Every regular file under `folders` (and what it holds of each needle) that holds one of `needles`."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {needle!r}" for needle in needles if needle.encode() in data]
    return found


def check_no_prompt_answer_or_key_in_logs(endpoint: str, pid: int, key: str, model: str, log: Path) -> None:
    """A marked prompt, streamed and not: neither it, nor the answer, nor the key reaches any file of the run."""
    mark = f"secret-prompt-{uuid.uuid4().hex}"
    auth = {"Authorization": f"Bearer {key}"}
    answers = []
    for stream in (False, True):
        body = {"model": model, "prompt": f"{mark} tell me", "max_tokens": 24, "ignore_eos": True, "stream": stream}
        response = httpx.post(f"{endpoint}/v1/completions", json=body, headers=auth, timeout=120)
        assert response.status_code == 200, response.text
        if not stream:
            answers.append(response.json()["choices"][0]["text"])
    folders = session_folders(pid)
    assert any((folder / "ray").is_dir() for folder in folders), folders  # not vacuous: Ray's log folder is there
    needles = [mark, key, *(answer for answer in answers if len(answer.strip()) >= 24)]
    leaks = files_containing([*folders, log.parent], needles)
    assert not leaks, f"user data or the key in the run's files: {leaks}"
    for child in marked_processes(owner_mark(pid)):
        environment = Path(f"/proc/{child}/environ").read_bytes() if os.path.exists(f"/proc/{child}") else b""
        assert key.encode() not in environment, f"the key is in process {child}'s environment"
