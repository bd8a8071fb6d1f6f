"""The CLI as users and the image run it: `python -m workload validate|run`, exit codes, messages, failure note."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.workload.jobrun import job_command, write_config, write_jsonl


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(job_command(*args), capture_output=True, text=True, timeout=120)


def test_validate_reports_rows_without_starting_an_engine(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}, "{bad", {"id": "a", "prompt": "y"}])
    config = write_config(tmp_path / "job.yaml", str(source), str(tmp_path / "out"), tmp_path / "models")
    result = _cli("validate", "--config", str(config))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["rows_in"], report["rows_valid"], report["rows_invalid"]) == (3, 1, 2)
    assert report["invalid_by_type"] == {"duplicate_id": 1, "malformed_json": 1}
    assert not (tmp_path / "out").exists() and not (tmp_path / "models").exists()


def test_bad_config_stops_before_any_work_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("input: {uri: in.jsonl}\noutput: {uri: out}\nengine: {max_num_seqs: 0}\n")
    result = _cli("run", "--config", str(config))
    assert result.returncode == 2
    assert "engine.max_num_seqs" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_source_that_is_no_model_stops_before_any_work(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "x"}])
    (tmp_path / "not-a-model").mkdir()
    config = write_config(tmp_path / "job.yaml", str(source), str(tmp_path / "out"), tmp_path / "models")
    for model, named in ((tmp_path / "not-a-model", "no config.json"), (tmp_path / "gone", "no such local folder")):
        result = _cli("run", "--config", str(config), "--model", str(model))
        assert result.returncode == 2, result.stderr
        assert f"model.source {model}" in result.stderr and named in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "models").exists()


def test_flags_override_the_file(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.yaml", "nowhere.jsonl", str(tmp_path / "out"), tmp_path / "models")
    source = write_jsonl(tmp_path / "real.jsonl", [{"id": "a", "prompt": "x"}])
    result = _cli("validate", "--config", str(config), "--input", str(source))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows_valid"] == 1


def test_unreadable_input_fails_fast_and_leaves_a_failure_note(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path / "job.yaml", str(tmp_path / "missing"), str(out), tmp_path / "models")
    result = _cli("run", "--config", str(config))
    assert result.returncode == 2
    assert "holds no input files" in result.stderr
    failure = json.loads((out / "_failed.json").read_text())
    assert failure["error_type"] == "InputError" and "holds no input files" in failure["error_message"]
    assert failure["reason"].startswith("InputError: ")
