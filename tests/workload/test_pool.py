"""Pool mode (issue 62): several OpenAI batches on one engine, each member's output exactly a lone job's.

The slow tests run the real job (Ray, Ray Data LLM, CPU vLLM, the embedded tiny model), one pool run per engine
start; the fast ones check the spec's refusals, which come before any lease, Ray or engine."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workload.jobrun import ENGINE, finish, run_job, start_job, write_config
from workload.contract.config import ConfigError, load_config
from workload.job.pool import PoolMember, member_config, read_spec


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")  # the tiny model, built once for the module's runs


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


def _answers(output: Path) -> list[str]:
    """The custom_ids of output.jsonl, each line checked to be an answer."""
    ids = []
    for line in (output / "output.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["response"]["status_code"] == 200, record
        assert record["response"]["body"]["choices"][0]["message"]["content"] is not None
        ids.append(record["custom_id"])
    return ids


def _markers(output: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((output / "_commits").glob("*.json"))]


def _read(path: Path) -> dict[str, Any]:
    value = json.loads(path.read_text())
    assert isinstance(value, dict)
    return value


@pytest.mark.slow
def test_a_small_batch_finishes_while_a_large_one_runs_on_the_same_engine(tmp_path: Path, model_cache: Path) -> None:
    """One engine for two batches (40 lines and 4, both ids request-0...): each member's folder is a lone job's, the
    small one's summary is written while the large one still has shards to commit, and a member whose input is
    missing is refused alone (its own _failed.json) while the others run."""
    large, small = _batch(tmp_path, "large", 40), _batch(tmp_path, "small", 4)
    spec = _spec(tmp_path, [("large", large), ("small", small), ("gone", tmp_path / "inputs" / "gone.jsonl")])
    code, log = run_job(["run", "--config", str(_config(tmp_path, spec, model_cache))], timeout=420)
    assert code == 0, log[-4000:]
    out = tmp_path / "out"
    assert log.count("Started a local Ray instance") <= 1

    for name, lines in (("large", 40), ("small", 4)):
        ids = _answers(out / name)
        assert sorted(ids) == sorted(f"request-{i}" for i in range(lines)), name
        summary = _read(out / name / "summary.json")
        assert summary["rows_in"] == summary["rows_ok"] == lines
        assert summary["openai_files"] == {"output_lines": lines, "error_lines": 0}
        assert summary["share_basis"] == "tokens" and summary["wall_s"] > 0
        assert summary["shards"] == len(_markers(out / name)) == lines // 4  # shards numbered within the member
        assert not (out / name / "_lease.json").exists()

    # The small batch was finished early: large shards were still committed after its summary was written.
    finished = _read(out / "small" / "summary.json")["finished_at"]
    later = [m for m in _markers(out / "large") if m["committed_at"] > finished]
    assert len(later) >= 2, (finished, [m["committed_at"] for m in _markers(out / "large")])

    failed = _read(out / "gone" / "_failed.json")
    assert failed["error_type"] == "InputError", failed
    assert not (out / "gone" / "summary.json").exists()

    pool = _read(out / "pool" / "summary.json")
    assert pool["pool"] == "pool-1" and pool["finished_at"] >= finished
    assert pool["members"]["large"] == pool["members"]["small"] == "completed"
    assert pool["members"]["gone"].startswith("failed: InputError")
    assert not (out / "pool" / "_failed.json").exists() and not (out / "pool" / "_lease.json").exists()


@pytest.mark.slow
def test_sigterm_stops_every_member_and_a_rerun_with_one_more_resumes_them(tmp_path: Path, model_cache: Path) -> None:
    """SIGTERM mid-run: each member stops as a lone job does (commits kept, `_interrupted.json`), the pool notes
    it too and exits 143; the same pool rerun with a third batch appended resumes the two and runs the third:
    every line of every member answered exactly once."""
    first, second = _batch(tmp_path, "first", 48), _batch(tmp_path, "second", 48)
    spec = _spec(tmp_path, [("first", first), ("second", second)])
    config = _config(tmp_path, spec, model_cache, max_tokens=24)
    out = tmp_path / "out"
    job = start_job(["run", "--config", str(config)])
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None and len(_markers(out / "first")) < 2:
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)  # to the driver alone, as the kubelet does to PID 1
    code, log = finish(job, timeout=300)
    assert code == 143, log[-4000:]
    pool_note = _read(out / "pool" / "_interrupted.json")
    assert pool_note["signal"] == "SIGTERM" and not (out / "pool" / "summary.json").exists()
    stopped = [n for n in ("first", "second") if (out / n / "_interrupted.json").exists()]
    assert stopped, "the SIGTERM landed after both members finished: nothing was left to resume"
    committed = {n: len(_markers(out / n)) for n in ("first", "second")}

    third = _batch(tmp_path, "third", 4)
    _spec(tmp_path, [("first", first), ("second", second), ("third", third)])
    code, log = run_job(["run", "--config", str(config)], timeout=420)
    assert code == 0, log[-4000:]
    for name, lines in (("first", 48), ("second", 48), ("third", 4)):
        ids = _answers(out / name)
        assert sorted(ids) == sorted(f"request-{i}" for i in range(lines)), name
        assert not (out / name / "_interrupted.json").exists()
    for name in stopped:  # resumed: the first run's commits kept, the rest committed by a second attempt
        summary = _read(out / name / "summary.json")
        assert summary["attempts"] == 2 and summary["shards"] == 12
        assert committed[name] < 12
    pool = _read(out / "pool" / "summary.json")
    assert pool["members"] == {"first": "completed", "second": "completed", "third": "completed"}
    assert not (out / "pool" / "_interrupted.json").exists()


# --- the spec, refused before any work ------------------------------------------------------------------------


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
