"""Pool mode (issue 62): several OpenAI batches on one engine, each member's output exactly a lone job's.

Here: the spec's refusals, which come before any lease, Ray or engine, and members refused before any work. The
members that run on one engine (finishing early, stopped by SIGTERM, resumed with a member more or one less) are
checked with the real job through the Batch API, tests/workload/test_batch_api_e2e.py, whose runs are this mode:
one engine start serves both, as the suite's time allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.workload.jobrun import ENGINE, run_job, write_config
from workload.contract.config import ConfigError, load_config
from workload.job.pool import PoolMember, member_config, read_spec


def _request(custom_id: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "llm-batch", "messages": [{"role": "user", "content": f"Say {custom_id}."}]},
    }


def _batch(folder: Path, name: str, lines: int) -> Path:
    """A batch's input file; every batch names its lines request-0, request-1, ...: ids repeat across members."""
    path = folder / "inputs" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(_request(f"request-{i}")) + "\n" for i in range(lines)))
    return path


def _spec(folder: Path, members: list[tuple[str, Path | str]]) -> Path:
    spec = folder / "tonight.pool.json"
    entries = [{"name": n, "input": str(i), "output": str(folder / "out" / n)} for n, i in members]
    spec.write_text(json.dumps({"pool": "pool-1", "members": entries}))
    return spec


def _config(folder: Path, spec: Path, model_cache: Path, max_tokens: int = 8) -> Path:
    return write_config(
        folder / "job.yaml",
        str(spec),
        str(folder / "out" / "pool"),
        model_cache,
        input={"uri": str(spec), "format": "openai", "openai_url": "/v1/chat/completions"},
        output={"uri": str(folder / "out" / "pool"), "shard_rows": 4},
        sampling={"max_tokens": max_tokens, "temperature": 0.0},
        engine=ENGINE,
    )


def _read(path: Path) -> dict[str, Any]:
    value = json.loads(path.read_text())
    assert isinstance(value, dict)
    return value


def test_members_refused_before_any_work_are_reported_alone_and_start_no_engine(tmp_path: Path) -> None:
    """A member whose input is missing, and one whose output was made from another input, are refused each in its
    own folder (`_failed.json`, as a lone job's refusal), the pool's summary names both, it exits 0 (the Batch API
    fails those batches and no other), and with no member left to run no Ray or engine starts. The members that
    run, finish early, stop and resume are the Batch API end to end's (tests/workload/test_batch_api_e2e.py, whose
    shared runs are this mode with the real engine)."""
    other = _batch(tmp_path, "other", 2)
    changed = tmp_path / "out" / "changed"
    changed.mkdir(parents=True)
    manifest = {"generation": 1, "config_hash": "x", "output_affecting": {}, "input_fingerprint": "0" * 16,
                "input_files": {str(other): {"size": 1, "version": "v0"}}, "rows_in": 2, "attempts": []}  # fmt: skip
    (changed / "_manifest.json").write_text(json.dumps(manifest))
    spec = _spec(tmp_path, [("gone", tmp_path / "inputs" / "gone.jsonl"), ("changed", _batch(tmp_path, "new", 2))])
    code, log = run_job(["run", "--config", str(_config(tmp_path, spec, tmp_path / "models"))], timeout=120)
    assert code == 0, log[-4000:]
    assert "Started a local Ray instance" not in log
    out = tmp_path / "out"
    assert _read(out / "gone" / "_failed.json")["error_type"] == "InputError"
    assert _read(out / "changed" / "_failed.json")["error_type"] == "OutputMismatchError"
    pool = _read(out / "pool" / "summary.json")
    assert pool["members"]["gone"].startswith("failed: InputError")
    assert pool["members"]["changed"].startswith("failed: OutputMismatchError")
    assert not (out / "pool" / "_lease.json").exists()


def _spec_error(tmp_path: Path, content: Any, raw: bool = False) -> str:
    path = tmp_path / "p.pool.json"
    path.write_text(content if raw else json.dumps(content))
    with pytest.raises(ConfigError) as caught:
        read_spec(str(path), str(tmp_path / "pool"))
    return str(caught.value)


def _member(name: str, output: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "input": f"/in/{name}.jsonl", "output": output, **extra}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([], "not a JSON object"),
        ({"pool": "p", "members": []}, "members: List should have at least 1 item"),
        ({"pool": "p", "members": [_member("a", "/o/a"), _member("a", "/o/b")]}, "duplicate names ['a']"),
        ({"pool": "p", "members": [_member("a", "/o/a"), _member("b", "/o/a/")]}, "duplicate outputs"),
        ({"pool": "p", "members": [_member("a", "/o/a"), _member("b", "/o/a/b")]}, "overlap"),
        ({"pool": "p", "members": [_member("a", "/o/a", colour="red")]}, "members.0.colour: Extra inputs"),
        ({"members": [_member("a", "/o/a")]}, "pool: Field required"),
        (
            {
                "pool": "p",
                "members": [
                    _member("a", "/o/a", image_files={"file-" + "0" * 24: "/i/x.png"}),
                    _member("b", "/o/b", image_files={"file-" + "0" * 24: "/i/y.png"}),
                ],
            },
            "is mapped to",
        ),
    ],
)
def test_a_spec_that_cannot_run_is_refused_naming_the_problem(tmp_path: Path, content: Any, expected: str) -> None:
    assert expected in _spec_error(tmp_path, content)


def test_a_spec_that_is_not_json_or_not_there_is_refused(tmp_path: Path) -> None:
    assert "not JSON" in _spec_error(tmp_path, "{members", raw=True)
    with pytest.raises(ConfigError, match="cannot read the pool spec"):
        read_spec(str(tmp_path / "absent.pool.json"), str(tmp_path / "pool"))


def test_a_member_writing_into_the_pools_own_folder_is_refused(tmp_path: Path) -> None:
    spec = {"pool": "p", "members": [_member("a", str(tmp_path / "pool") + "/")]}
    assert "its output is the pool's output" in _spec_error(tmp_path, spec)


def test_a_members_config_is_the_lone_jobs_over_its_input(tmp_path: Path) -> None:
    """Same settings, same output hash: a member's output resumes under a lone job with the member's input."""
    pool = load_config(None, {"input.uri": "/s/p.pool.json", "output.uri": "/o/pool", "input.format": "openai"})
    lone = load_config(None, {"input.uri": "/in/a.jsonl", "output.uri": "/o/a", "input.format": "openai"})
    config = member_config(pool, PoolMember(name="a", input="/in/a.jsonl", output="/o/a"))
    assert config == lone and config.output_hash() == lone.output_hash()
    with pytest.raises(ConfigError, match=r"pool member .b.: input\.image_files"):
        member_config(pool, PoolMember(name="b", input="/in/b.jsonl", output="/o/b", image_files={"x": "/i.png"}))


def test_the_cli_refuses_a_bad_spec_before_any_lease(tmp_path: Path) -> None:
    from workload.cli.commands import EXIT_BAD_CONFIG, main

    spec = tmp_path / "p.pool.json"
    spec.write_text(json.dumps({"pool": "p", "members": []}))
    assert main(["run", "--input", str(spec), "--output", str(tmp_path / "pool")]) == EXIT_BAD_CONFIG
    assert not (tmp_path / "pool").exists()


def test_validate_reads_every_members_input_as_a_lone_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workload.cli.commands import main

    good = _batch(tmp_path, "good", 3)
    spec = _spec(tmp_path, [("good", good), ("gone", tmp_path / "inputs" / "gone.jsonl")])
    assert main(["validate", "--input", str(spec)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pool"] == "pool-1"
    assert report["members"]["good"]["rows_valid"] == 3
    assert "holds no input files" in report["members"]["gone"]["error"]
