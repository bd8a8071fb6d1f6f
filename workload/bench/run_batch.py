"""The job against `vllm run-batch`, the tool a user would pick instead: one OpenAI chat batch file, two tools.

`python -m workload bench --run-batch 200,10000 --out DIR` writes, per line count, one seeded chat batch file
(the profile's prompts and short answer lengths, greedy) and runs on it, one after the other:

- **run-batch**: vLLM's own batch runner, through vLLM's own command line (`workload.serve.vllm_cli run-batch`:
  the CPU build's `vllm` script cannot start, the wrapper changes nothing else), in vLLM's default process layout,
  the way a user runs it;
- **job**: `python -m workload run` on the same file, the product's default feed.

Both get the same model (the profile's) and the same engine arguments: run-batch's flags are made from the job's
own `engine_kwargs`, so they cannot drift apart. Each is timed from its process start to its exit, and each log
line is stamped as it arrives, so the wall time splits into phases read off the tools' own lines and marks
(`phases`): where the time goes, not only how much.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from workload.bench import startup
from workload.bench.generator import generate
from workload.bench.profiles import BenchProfile
from workload.contract.entrypoint import ENTRYPOINT
from workload.telemetry import startup_trace

SERVED_NAME = "llm-batch"  # the job's default model name, served under the same name by run-batch

# Phase name, the log line that ends it (a regex; None: the process's exit). Each phase starts where the one
# before ended. run-batch's own lines (vllm/entrypoints/launchers/run_batch.py, vLLM 0.32): the version line once
# its imports are done, "Supported tasks" once the engine is built, "Writing outputs to" once every request ended.
RUN_BATCH_PHASES: tuple[tuple[str, str | None], ...] = (
    ("python and imports", r"vLLM batch processing API version"),
    ("engine build (engine process, model load, KV cache)", r"Supported tasks"),
    ("requests (prefill and decode)", r"Writing outputs to"),
    ("output writing and exit", None),
)
# The job's phases end at the marks its own code writes (workload/telemetry/startup_trace.py), as in the bench's
# start-up breakdown up to the engine's build, then at its exit.
JOB_PHASES: tuple[tuple[str, str | None], ...] = (
    *startup.JOB_PHASES[:-1],
    ("requests, output commits and exit", None),
)


def chat_lines(profile: BenchProfile, count: int) -> list[dict[str, Any]]:
    """`count` OpenAI chat lines: the profile's seeded prompts, its short answer lengths, greedy."""
    spec = profile.workload.model_copy(update={"num_requests": count, "long_fraction": 0.0})
    return [
        {
            "custom_id": f"request-{request.bench_id}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": SERVED_NAME,
                "messages": [{"role": "user", "content": request.prompt}],
                "max_tokens": request.max_tokens,
                "temperature": 0,
            },
        }
        for request in generate(spec)
    ]


def engine_flags(kwargs: dict[str, Any]) -> list[str]:
    """vLLM's command-line flags for `vllm.LLM` keyword arguments: `--max-num-seqs 32`, `--enforce-eager` or
    `--no-enforce-eager` (vLLM's booleans take both forms), a dict as JSON; None is vLLM's default, so left out."""
    flags: list[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            flags += [flag, str(value)]
    return flags


def run_batch_command(batch_in: Path, batch_out: Path, kwargs: dict[str, Any]) -> list[str]:
    """vLLM's batch runner on `batch_in`, with the engine arguments `kwargs` (the model's path among them)."""
    engine = dict(kwargs)
    model = engine.pop("model")
    return [
        sys.executable,
        "-m",
        "workload.serve.vllm_cli",
        "run-batch",
        "-i",
        str(batch_in),
        "-o",
        str(batch_out),
        "--model",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        *engine_flags(engine),
    ]


def job_command(config_file: Path) -> list[str]:
    return [sys.executable, *ENTRYPOINT[1:], "run", "--config", str(config_file)]


@dataclass(frozen=True)
class TimedRun:
    """A finished process: its wall time, its exit status and each output line with the seconds since its start."""

    wall_s: float
    returncode: int
    lines: list[tuple[float, str]]


def timed_run(command: list[str], env: dict[str, str], log: Path, timeout_s: float) -> TimedRun:
    """Run `command`, stamping each line of its merged stdout and stderr as it arrives (also written to `log`)."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with (
        log.open("w", encoding="utf-8") as sink,
        subprocess.Popen(
            command,
            # PYTHONUNBUFFERED: each line arrives (and is stamped) when written, not when a pipe's buffer fills.
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as process,
    ):
        # A timer, not a check per line: a tool that hangs silently is stopped too.
        deadline = threading.Timer(timeout_s, process.kill)
        deadline.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                at = time.monotonic() - started
                lines.append((at, line.rstrip("\n")))
                sink.write(f"[{at:8.2f}s] {line}")
            returncode = process.wait()
        finally:
            deadline.cancel()
    if time.monotonic() - started >= timeout_s:
        raise RuntimeError(f"{' '.join(command[1:4])} ran past {timeout_s:.0f} s and was stopped; its log: {log}")
    return TimedRun(wall_s=round(time.monotonic() - started, 2), returncode=returncode, lines=lines)


def line_phases(run: TimedRun, phases: tuple[tuple[str, str | None], ...]) -> dict[str, float | None]:
    """Seconds per phase, each ending at the first line matching its pattern after the previous phase's end; a
    pattern never seen leaves its phase and the next unmeasured (None)."""
    ends: list[float | None] = []
    previous: float | None = 0.0
    for _name, pattern in phases:
        if pattern is None:
            end: float | None = run.wall_s
        elif previous is None:
            end = None
        else:
            start = previous
            end = next((at for at, text in run.lines if at >= start and re.search(pattern, text)), None)
        ends.append(end)
        previous = end
    return _durations([name for name, _ in phases], ends)


def mark_phases(
    run: TimedRun, marks: dict[str, float], process_start: float, phases: tuple[tuple[str, str | None], ...]
) -> dict[str, float | None]:
    """Seconds per phase from wall-clock marks (`process_start` the Unix time the process began)."""
    ends = [run.wall_s if mark is None else _since(marks.get(mark), process_start) for _, mark in phases]
    return _durations([name for name, _ in phases], ends)


def _since(instant: float | None, start: float) -> float | None:
    return None if instant is None else instant - start


def _durations(names: list[str], ends: list[float | None]) -> dict[str, float | None]:
    seconds: dict[str, float | None] = {}
    previous: float | None = 0.0
    for name, end in zip(names, ends, strict=True):
        seconds[name] = None if end is None or previous is None else round(end - previous, 2)
        previous = end
    return seconds


def answer_counts(path: Path) -> dict[str, int]:
    """Lines answered with status 200, and their completion tokens (from each body's usage), in an output file."""
    answered = tokens = 0
    if path.is_file():
        for raw in path.read_text(encoding="utf-8").splitlines():
            if not raw.strip():
                continue
            response = json.loads(raw).get("response") or {}
            if response.get("status_code") == 200:
                answered += 1
                tokens += int((response["body"].get("usage") or {}).get("completion_tokens") or 0)
    return {"answered": answered, "completion_tokens": tokens}


def write_job_config(path: Path, profile: BenchProfile, model_path: str, input_dir: Path, output_dir: Path) -> Path:
    """The job's config: the profile's job config (its engine and feed), reading `input_dir`, writing `output_dir`."""
    config = profile.job_config(model_path, path.parent).model_dump(mode="json", exclude_defaults=True)
    config["input"] = {"uri": str(input_dir)}
    config["output"] = {**config.get("output", {}), "uri": str(output_dir)}
    path.write_text(yaml.safe_dump(config))
    return path


def run_point(
    profile: BenchProfile, model_path: str, count: int, folder: Path, env: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """One line count: the batch file, then run-batch and the job on it; their times, phases and answers."""
    from workload.bench.engine_args import engine_kwargs

    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "input" / "batch.jsonl"
    source.parent.mkdir(exist_ok=True)
    source.write_text("".join(json.dumps(line) + "\n" for line in chat_lines(profile, count)))
    config = profile.job_config(model_path, folder)
    kwargs = {**engine_kwargs(config, model_path)}
    kwargs.pop("disable_log_stats", None)  # the engine modes' per-request timestamps; run-batch keeps its default

    vllm_out = folder / "run-batch-output.jsonl"
    vllm = timed_run(
        run_batch_command(source, vllm_out, kwargs),
        {**env, "VLLM_LOGGING_LEVEL": "INFO"},  # its phase lines are INFO lines
        folder / "run-batch.log",
        timeout_s,
    )
    trace = folder / "job-startup.jsonl"
    trace.unlink(missing_ok=True)
    config_file = write_job_config(folder / "job.yaml", profile, model_path, source.parent, folder / "job-output")
    job_start = time.time()
    job_env = {**env, startup_trace.VARIABLE: str(trace)}
    job = timed_run(job_command(config_file), job_env, folder / "job.log", timeout_s)
    marks = startup_trace.first_marks(startup_trace.read_marks(trace))
    result = {
        "lines": count,
        "run_batch": {
            "wall_s": vllm.wall_s,
            "returncode": vllm.returncode,
            "phases_s": line_phases(vllm, RUN_BATCH_PHASES),
            **answer_counts(vllm_out),
        },
        "job": {
            "wall_s": job.wall_s,
            "returncode": job.returncode,
            "phases_s": mark_phases(job, marks, job_start, JOB_PHASES),
            **answer_counts(folder / "job-output" / "output.jsonl"),
        },
    }
    result["job_over_run_batch"] = round(job.wall_s / vllm.wall_s, 2) if vllm.wall_s else None
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    rows = [
        "| lines | tool | wall s | answered | completion tokens | where the time went (s) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for tool in ("run_batch", "job"):
            item = result[tool]
            where = "; ".join(f"{name} {value}" for name, value in item["phases_s"].items())
            rows.append(
                f"| {result['lines']} | {tool.replace('_', '-')} | {item['wall_s']} | {item['answered']} | "
                f"{item['completion_tokens']} | {where} |"
            )
        rows.append(f"| {result['lines']} | job / run-batch | {result['job_over_run_batch']} | | | |")
    return "\n".join(rows) + "\n"


def run_comparison(
    profile: BenchProfile, counts: list[int], out: Path, model_cache: Path, timeout_s: float = 1800
) -> list[dict[str, Any]]:
    """Every line count in turn into OUT/run-batch-LINES/; OUT/run_batch.json and run_batch.md hold the figures."""
    import tempfile

    from workload.bench.isolation import worker_env
    from workload.bench.profiles import materialise_model

    model_path = str(materialise_model(profile.model, model_cache.expanduser()))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for count in counts:
        # Ray's socket paths must stay short: the scratch folder lives in the system temp dir, not under `out`.
        scratch = Path(tempfile.mkdtemp(prefix="llmb-rb-"))
        try:
            env = worker_env(scratch, profile.engine)
            results.append(run_point(profile, model_path, count, out / f"run-batch-{count}", env, timeout_s))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        (out / "run_batch.json").write_text(json.dumps(results, indent=2))
    (out / "run_batch.md").write_text(markdown(results))
    return results
