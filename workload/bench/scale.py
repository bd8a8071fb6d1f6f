"""The `scale` profile: the real job (`python -m workload run`) at growing input sizes, to show that the driver's
memory and its time to the first engine request do not grow with the number of rows.

Per size: a seeded input of short prompts over several files, with a few percent malformed lines and a few percent
repeated ids (some repeating an id of an earlier file), answered with `max_tokens` 1 on the tiny model; then the
same command again over the finished output (a resume with nothing left to do). Figures come from the job's own
manifest (the driver's peak RSS, its timings) and from the wall clock around each command. With
`scale_input: s3` the input lies in a bucket of a counting moto server, and each command's S3 requests and the bytes
its object GETs returned are recorded too (workload/bench/counted_s3.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from workload.bench.counted_s3 import CountedS3, counted_s3
from workload.bench.isolation import worker_env
from workload.bench.profiles import BenchProfile, materialise_model
from workload.bench.progress import say
from workload.bench.repro import command_line, git_commit, hardware, versions

FILES = 10
BAD_EVERY = 37  # one malformed line in 37 (2.7%)
DUPLICATE_EVERY = 41  # one repeated id in 41 (2.4%)
TARGET_MEMORY_GROWTH = 1.3  # driver peak RSS at the largest size over the smallest, at most
TARGET_FIRST_REQUEST_GROWTH = 1.5  # time to the first engine request, largest size over smallest, at most
PROJECT_TO = (10_000_000, 100_000_000)
SCALE_DEFINITIONS = {
    "driver_peak_rss_gib": "the job driver's own peak resident memory (VmHWM of its process), from the manifest",
    "time_to_first_engine_request_s": "from the job's start to its first engine request: when the engine actor "
    "that answered the first batch to reach the driver took its first batch (stamped on its rows, Unix time)",
    "wall_s": "wall clock around `python -m workload run` (process start to exit)",
    "rows_per_s": "input rows over wall_s",
    "resume_s": "wall clock of the same command over the finished output (lease, plan, reopen, summary)",
    "s3": "with scale_input s3: per command (job, resume), the S3 requests by kind (object_get, object_head, list) "
    "and the bytes the object GETs returned, counted at the moto server",
    "input_bytes": "the input files' total size, to set object_get_bytes against",
}


def write_input(folder: Path, rows: int) -> dict[str, int]:
    """The input of one size, and how many rows of each kind it holds."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // FILES)
    counts = {"good": 0, "bad": 0, "duplicate": 0}
    for file in range(FILES):
        lines = []
        for i in range(file * per_file, min(rows, (file + 1) * per_file)):
            if i % BAD_EVERY == BAD_EVERY - 1:  # checked first: a row is bad, a repeat, or good
                lines.append(f'{{"id": "bad-{i}", "prompt": ')
                counts["bad"] += 1
            elif i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1:
                # About 500 rows back: near a file's start that is a row of the file before it.
                lines.append(json.dumps({"id": f"r-{_good_row_before(i - 500)}", "prompt": "again"}))
                counts["duplicate"] += 1
            else:
                lines.append(json.dumps({"id": f"r-{i}", "prompt": f"Question {i % 97}: why?"}))
                counts["good"] += 1
        (folder / f"part-{file:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return counts


def _is_good(i: int) -> bool:
    return i % BAD_EVERY != BAD_EVERY - 1 and i % DUPLICATE_EVERY != DUPLICATE_EVERY - 1


def _good_row_before(i: int) -> int:
    """The nearest good row at or before `i` (row 0 is good): the id a repeated row repeats."""
    i = max(i, 0)
    while not _is_good(i):
        i -= 1
    return i


def _job_config(profile: BenchProfile, model_path: str, run_dir: Path) -> dict[str, Any]:
    config = profile.job_config(model_path, run_dir).model_dump(mode="json", exclude_unset=True)
    config["sampling"] = {"max_tokens": 1, "temperature": 0.0}
    return config


def _run(config: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "workload", "run", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if completed.returncode != 0:
        raise RuntimeError(
            f"the job exited with {completed.returncode}:\n{completed.stdout[-3000:]}{completed.stderr[-6000:]}"
        )
    return wall, completed.stderr


def run_size(
    profile: BenchProfile, model_path: str, rows: int, root: Path, scratch: Path, s3: CountedS3 | None = None
) -> dict[str, Any]:
    run_dir = root / str(rows)
    shutil.rmtree(run_dir, ignore_errors=True)
    counts = write_input(run_dir / "input", rows)
    input_bytes = sum(p.stat().st_size for p in (run_dir / "input").iterdir())
    config = _job_config(profile, model_path, run_dir)
    env = worker_env(scratch / str(rows), profile.engine)
    if s3 is not None:
        config["input"]["uri"] = s3.upload(run_dir / "input", f"run-{rows}-{time.time_ns()}")
        env.update(s3.env)
    config_file = run_dir / "job.yaml"
    config_file.write_text(yaml.safe_dump(config))
    load_before = os.getloadavg()
    say(f"scale {rows} rows: running the job")
    wall, _ = _run(config_file, env)
    job_requests = s3.take() if s3 is not None else None
    manifest = json.loads((run_dir / "output" / "_manifest.json").read_text())
    summary = json.loads((run_dir / "output" / "summary.json").read_text())
    first = manifest["attempts"][0]
    say(f"scale {rows} rows: done in {wall:.0f} s; resuming over the finished output")
    resume_wall, resume_log = _run(config_file, env)
    resume_requests = s3.take() if s3 is not None else None
    load_after = os.getloadavg()
    resumed = json.loads((run_dir / "output" / "_manifest.json").read_text())["attempts"][-1]
    timings = first.get("timings_s", {})
    result = {
        "rows": rows,
        "input": counts,
        "rows_ok": summary["rows_ok"],
        "rows_failed": summary["rows_failed"],
        "errors_by_type": summary["errors_by_type"],
        "every_good_row_answered": summary["rows_ok"] == counts["good"],
        "driver_peak_rss_gib": round(first["driver_peak_rss_mib"] / 1024, 4),
        "time_to_first_engine_request_s": timings.get("first_engine_request_s"),
        "wall_s": round(wall, 2),
        "rows_per_s": round(rows / wall, 1),
        "resume_s": round(resume_wall, 2),
        "resume_driver_peak_rss_gib": round(resumed["driver_peak_rss_mib"] / 1024, 4),
        "shards": summary["shards"],
        "job_timings_s": timings,
        "resume_timings_s": resumed.get("timings_s", {}),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
        "input_bytes": input_bytes,
    }
    if job_requests is not None:
        result["s3"] = {"job": job_requests, "resume": resume_requests}
    if "already committed" not in resume_log:
        result["resume_note"] = "the resume did not report committed shards"
    shutil.rmtree(run_dir / "input", ignore_errors=True)  # the output stays for inspection; the input is seeded
    return result


def _growth(sizes: dict[str, dict[str, Any]], key: str) -> float | None:
    ordered = sorted(sizes.values(), key=lambda s: s["rows"])
    low, high = ordered[0].get(key), ordered[-1].get(key)
    return round(high / low, 3) if low and high else None


def project_memory(sizes: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The driver's peak memory at far larger inputs, on the line through the smallest and largest sizes."""
    ordered = sorted(sizes.values(), key=lambda s: s["rows"])
    low, high = ordered[0], ordered[-1]
    slope = (high["driver_peak_rss_gib"] - low["driver_peak_rss_gib"]) / (high["rows"] - low["rows"])
    return {str(rows): round(low["driver_peak_rss_gib"] + slope * (rows - low["rows"]), 3) for rows in PROJECT_TO} | {
        "gib_per_million_rows": round(slope * 1_000_000, 4)
    }


def run_scale(profile: BenchProfile, out: Path, model_cache: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    reproducibility = {
        "command": command_line(),
        "commit": git_commit(Path(__file__).resolve().parents[2]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions(),
        "hardware": hardware(profile.device),
        "profile": profile.model_dump(mode="json"),
    }
    model_path = str(materialise_model(profile.model, model_cache.expanduser()))
    scratch = Path(tempfile.mkdtemp(prefix="llmb-scale-"))
    sizes: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(counted_s3()) if profile.scale_input == "s3" else None
        _run_sizes(profile, model_path, out, scratch, s3, sizes, errors, reproducibility)
    scorecard = _scorecard(profile, sizes, errors, reproducibility)
    (out / "scorecard.md").write_text(scale_markdown(scorecard["scale"]))
    say("done:\n" + scale_markdown(scorecard["scale"]))
    return scorecard


def _run_sizes(
    profile: BenchProfile,
    model_path: str,
    out: Path,
    scratch: Path,
    s3: CountedS3 | None,
    sizes: dict[str, dict[str, Any]],
    errors: dict[str, str],
    reproducibility: dict[str, Any],
) -> None:
    try:
        for rows in profile.scale_rows:
            try:
                sizes[str(rows)] = run_size(profile, model_path, rows, out / "job-runs", scratch, s3)
            except RuntimeError as error:
                errors[str(rows)] = str(error)
                say(f"scale {rows} rows FAILED: {error}")
            # Written after every size, so a run cut short still leaves the sizes it finished.
            scorecard = _scorecard(profile, sizes, errors, reproducibility)
            (out / "scorecard.json").write_text(json.dumps(scorecard, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _scorecard(
    profile: BenchProfile, sizes: dict[str, dict[str, Any]], errors: dict[str, str], reproducibility: dict[str, Any]
) -> dict[str, Any]:
    memory_growth = _growth(sizes, "driver_peak_rss_gib") if len(sizes) > 1 else None
    first_request_growth = _growth(sizes, "time_to_first_engine_request_s") if len(sizes) > 1 else None
    scale = {
        **sizes,
        "driver_memory_growth": memory_growth,
        "first_request_growth": first_request_growth,
        "targets": {
            "driver_memory_growth": TARGET_MEMORY_GROWTH,
            "first_request_growth": TARGET_FIRST_REQUEST_GROWTH,
        },
        "targets_met": {
            "driver_memory_growth": memory_growth is not None and memory_growth <= TARGET_MEMORY_GROWTH,
            "first_request_growth": first_request_growth is not None
            and first_request_growth <= TARGET_FIRST_REQUEST_GROWTH,
            "every_good_row_answered": bool(sizes) and all(s["every_good_row_answered"] for s in sizes.values()),
        },
        "projected_driver_peak_rss_gib": project_memory(sizes) if len(sizes) > 1 else None,
        "definitions": SCALE_DEFINITIONS,
    }
    # The scorecard's schema: the engine-comparison fields stay (empty: this profile runs the job alone).
    scorecard = {
        "schema_version": 1,
        "profile": profile.name,
        "continuous_over_synchronous": None,
        "job_over_continuous": None,
        "targets": {},
        "targets_met": {},
        "ratio_basis": None,
        "measurement": {},
        "runs": [],
        "sweep": [],
        "errors": errors,
        "scale": scale,
        "reproducibility": reproducibility,
    }
    return scorecard


def scale_markdown(scale: dict[str, Any]) -> str:
    rows = [key for key in scale if key.isdigit()]
    lines = [
        "| rows | driver peak GiB | first request s | wall s | rows/s | resume s | answered/good |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(rows, key=int):
        s = scale[key]
        lines.append(
            f"| {key} | {s['driver_peak_rss_gib']} | {s['time_to_first_engine_request_s']} | {s['wall_s']} | "
            f"{s['rows_per_s']} | {s['resume_s']} | {s['rows_ok']}/{s['input']['good']} |"
        )
    lines += [
        "",
        f"driver memory growth {scale['driver_memory_growth']} (target <= {TARGET_MEMORY_GROWTH}); "
        f"first request growth {scale['first_request_growth']} (target <= {TARGET_FIRST_REQUEST_GROWTH})",
        f"projected driver peak GiB: {scale['projected_driver_peak_rss_gib']}",
    ]
    for key in sorted((k for k in rows if "s3" in scale[k]), key=int):
        for command, counts in scale[key]["s3"].items():
            lines.append(
                f"{key} rows, {command}: {counts.get('object_get', 0)} object GETs, "
                f"{counts.get('object_get_bytes', 0)} bytes (input {scale[key]['input_bytes']}), "
                f"{counts.get('object_head', 0)} HEADs, {counts.get('list', 0)} listings"
            )
    return "\n".join(lines) + "\n"
