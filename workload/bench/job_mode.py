"""Mode 3: this project's Ray Data LLM pipeline (`workload.engine.pipeline.build_pipeline`), same engine args.

Each point runs the job's processor over the point's requests as a Ray Dataset and reads the per-request
vLLM timestamps back from the `metrics` column, so the job is timed exactly as the engine modes are. Ray
Data starts the engine actors anew for every dataset, so every point pays the job's start-up (reported as
`startup_s`).
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from workload.bench.generator import BenchRequest, WorkloadSpec, generate
from workload.bench.memory import PeakMemory
from workload.bench.progress import say
from workload.bench.records import RequestRecord, record_from_metrics, wall_to_monotonic_offset
from workload.bench.results import ModeRun
from workload.bench.startup import first_token_wall
from workload.contract.config import JobConfig
from workload.telemetry.startup_trace import mark

_PROGRESS_EVERY = 0.1  # report every tenth of the rows


def engine_blocks(requests: list[BenchRequest], detokenize: bool, batch_size: int) -> list[pa.Table]:
    """The engine input exactly as the job builds it: the same columns, cut by the job's own `input_blocks`."""
    from workload.engine.pipeline import engine_input, input_blocks

    table = engine_input(
        [request.bench_id for request in requests],
        [request.prompt for request in requests],
        [None] * len(requests),
        [request.sampling_params(detokenize) for request in requests],
    )
    return input_blocks(table, batch_size)


def record_from_row(row: dict[str, Any], request: BenchRequest, offset: float) -> RequestRecord:
    error = str(row.get("__inference_error__") or "")
    return record_from_metrics(
        bench_id=request.bench_id,
        kind=request.kind,
        expected_tokens=request.max_tokens,
        output_tokens=int(row.get("num_generated_tokens") or 0),
        prompt_tokens=int(row.get("num_input_tokens") or 0),
        metrics=row.get("metrics"),
        offset=offset,
        error=error,
    )


def _run_point(config: JobConfig, model_path: str, point: str, spec: WorkloadSpec, device: str) -> ModeRun:
    import ray.data

    from workload.engine.pipeline import build_pipeline, engine_feed

    requests = generate(spec)
    by_id = {request.bench_id: request for request in requests}
    blocks = engine_blocks(requests, spec.detokenize, config.batch_size)
    # Plain prompts only, as the job runs them: no chat-template stage.
    pipeline = build_pipeline(ray.data.from_arrow(blocks), config, model_path, keep_metrics=True, chat_template=False)
    feed = engine_feed(config)
    records: list[RequestRecord] = []
    step = max(1, int(len(requests) * _PROGRESS_EVERY))
    with PeakMemory("gpu" if device == "gpu" else "cpu") as memory:
        submitted = time.monotonic()
        # Consumed as the job consumes it: whole blocks as they arrive.
        for batch in pipeline.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                records.append(record_from_row(row, by_id[int(row["_pos"])], wall_to_monotonic_offset()))
                if len(records) % step == 0:
                    say(f"{point} job: {len(records)}/{len(requests)} rows")
        finished = time.monotonic()
    first = first_token_wall(records)
    if first is not None:
        mark("first_token", at=first)
    arrivals = [record.arrival for record in records if not record.error]
    startup_s = (min(arrivals) - submitted) if arrivals else finished - submitted
    return ModeRun(
        point=point,
        mode="job",
        startup_s=startup_s,
        submitted=submitted,
        finished=finished,
        peak_memory_bytes=memory.peak_bytes,
        memory_source=memory.source,
        records=records,
        notes={
            "batch_size": config.batch_size,
            "max_concurrent_batches": feed.batches,
            "rows_in_flight_per_engine": feed.rows_in_flight,
            "cpu_seconds_by_process": memory.cpu_seconds,
            "peak_pss_mib_by_process": memory.peak_mib_by_role,
        },
    )


def run_job_mode(config: JobConfig, model_path: str, points: list[tuple[str, WorkloadSpec]]) -> list[ModeRun]:
    from workload.runtime import ray_session

    # The job's own Ray session (scratch folders, progress bars off), so the job is measured as it runs.
    with ray_session(config.device, preload=("workload.engine.pipeline",)):
        runs = []
        for point, spec in points:
            say(f"{point}: job ({spec.num_requests} requests)")
            run = _run_point(config, model_path, point, spec, config.device)
            say(f"{point}: job done in {run.finished - run.submitted:.1f}s (start-up {run.startup_s:.1f}s)")
            runs.append(run)
        return runs
