"""Tenants apart (issue 60, findings 1 and 6), on the real app served by a real uvicorn server and driven by the
official openai client: key scope is the default, a record belongs to its key's *name* (a rotated key keeps it),
project-scope records are an admin key's, and a key under 32 characters never starts the server."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import openai
import pytest

from tests.workload.served_app import ServedApp
from tests.workload.test_batch_api import _line
from workload.auth.keys import ApiKeys, KeyConfigError, KeySource, keys_for_host
from workload.batch_api import cli
from workload.batch_api.app import build_app
from workload.batch_api.executor import LocalJobExecutor
from workload.batch_api.service import BatchService
from workload.batch_api.store import LocalStore
from workload.batch_api.tenants import MIN_KEY_CHARS, PROJECT_OWNER

TEAM_A, TEAM_A_ROTATED = "a" * 40, "A" * 40
TEAM_B, ADMIN = "b" * 40, "c" * 40
CHAT: Literal["/v1/chat/completions"] = "/v1/chat/completions"


class Tenants:
    """The app with its defaults (no scope given) over a key file the test rewrites, re-read on every request."""

    def __init__(self, tmp: Path) -> None:
        self.keys_file = tmp / "keys"
        self.write_keys(TEAM_A)
        self.store = LocalStore(tmp / "data")
        # The real local executor; no test here ticks, so it never starts a job.
        self.service = BatchService(self.store, LocalJobExecutor({}, tmp / "runs"), "llm-batch")
        keys = ApiKeys(KeySource(key_file=self.keys_file), refresh_s=0.0, min_chars=MIN_KEY_CHARS)
        self.served = ServedApp(build_app(self.service, keys))

    def write_keys(self, team_a_key: str) -> None:
        self.keys_file.write_text(f"team-a {team_a_key}\nteam-b {TEAM_B}\nops {ADMIN} admin\n")

    def client(self, key: str) -> openai.OpenAI:
        return self.served.client(key)

    def stop(self) -> None:
        self.served.stop()
        self.store.close()


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    running = Tenants(tmp_path_factory.mktemp("tenants"))
    yield running
    running.stop()


def test_by_default_another_key_sees_nothing_of_a_tenants(tenants: Tenants) -> None:
    """Fails on 1e5a373/main: the default was project scope, where team B read and deleted team A's file."""
    team_a, team_b = tenants.client(TEAM_A), tenants.client(TEAM_B)
    theirs = team_a.files.create(file=("in.jsonl", _line("a").encode()), purpose="batch")
    batch = team_a.batches.create(input_file_id=theirs.id, endpoint=CHAT, completion_window="24h")
    for call in (
        lambda: team_b.files.retrieve(theirs.id),
        lambda: team_b.files.content(theirs.id),
        lambda: team_b.files.delete(theirs.id),
        lambda: team_b.batches.retrieve(batch.id),
        lambda: team_b.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert theirs.id not in [f.id for f in team_b.files.list()]
    assert batch.id not in [b.id for b in team_b.batches.list()]
    assert team_a.files.retrieve(theirs.id).id == theirs.id  # still there: B's delete touched nothing


def test_a_key_rotated_under_its_name_keeps_its_records(tenants: Tenants) -> None:
    """The owner is the key's name: team A's new key reads what its old key made; the old key is refused."""
    made = tenants.client(TEAM_A).files.create(file=("in.jsonl", _line("r").encode()), purpose="batch")
    tenants.write_keys(TEAM_A_ROTATED)
    try:
        assert tenants.client(TEAM_A_ROTATED).files.retrieve(made.id).id == made.id
        with pytest.raises(openai.AuthenticationError):
            tenants.client(TEAM_A).files.retrieve(made.id)
    finally:
        tenants.write_keys(TEAM_A)


def test_project_scope_records_are_the_admins(tenants: Tenants) -> None:
    """A record written in project scope (before key scope was the default) is seen by the admin key only."""
    old = tenants.service.upload_file(PROJECT_OWNER, "old.jsonl", "batch", [_line("o").encode()])
    admin = tenants.client(ADMIN)
    assert admin.files.retrieve(old["id"]).id == old["id"]
    assert old["id"] in [f.id for f in admin.files.list()]
    batch = admin.batches.create(input_file_id=old["id"], endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        tenants.client(TEAM_A).files.retrieve(old["id"])
    with pytest.raises(openai.NotFoundError):
        tenants.client(TEAM_B).batches.retrieve(batch.id)
    admin.batches.cancel(batch.id)


def test_a_short_key_refuses_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fails on main: a key of one character was accepted. The refusal names the key's name, never its text."""
    keys = tmp_path / "keys"
    keys.write_text(f"team-a {TEAM_A}\nteam-b short-key\n")
    with pytest.raises(KeyConfigError, match=r"shorter than 32 characters \(team-b\)") as refused:
        keys_for_host("0.0.0.0", KeySource(key_file=keys), "the Batch API", MIN_KEY_CHARS)
    assert "short-key" not in str(refused.value)
    monkeypatch.setenv("LLM_BATCH_API_KEY", "k")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--host", "0.0.0.0", "--data", str(tmp_path / "data")])
    assert cli.run(args, exit_bad_config=2) == 2
    assert "shorter than 32 characters" in capsys.readouterr().err
