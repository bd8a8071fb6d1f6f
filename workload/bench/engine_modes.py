"""Modes 1 and 2 on one vLLM engine: synchronous chunks, then all requests at once (continuous batching).

Both modes share one `vllm.LLM` built once, so they differ only in how requests are fed: synchronous hands
the engine one chunk of `chunk_size` (= max_num_seqs) requests and waits for the chunk's longest request
before the next; continuous hands it everything and lets the scheduler refill each finished slot at once.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Literal

from tqdm import tqdm

from workload.bench.generator import BenchRequest, WorkloadSpec, generate
from workload.bench.memory import PeakMemory
from workload.bench.progress import say
from workload.bench.records import RequestRecord, record_from_metrics, wall_to_monotonic_offset
from workload.bench.results import ModeRun
from workload.bench.startup import first_token_wall
from workload.telemetry.startup_trace import mark


def _records(llm: Any, requests: list[BenchRequest], detokenize: bool, use_tqdm: Any) -> list[RequestRecord]:
    from vllm import SamplingParams

    params = [SamplingParams(**request.sampling_params(detokenize)) for request in requests]
    outputs = llm.generate([request.prompt for request in requests], params, use_tqdm=use_tqdm)
    offset = wall_to_monotonic_offset()
    records = []
    for request, output in zip(requests, outputs, strict=True):
        metrics = dataclasses.asdict(output.metrics) if output.metrics is not None else None
        records.append(
            record_from_metrics(
                bench_id=request.bench_id,
                kind=request.kind,
                expected_tokens=request.max_tokens,
                output_tokens=len(output.outputs[0].token_ids),
                prompt_tokens=len(output.prompt_token_ids or []),
                metrics=metrics,
                offset=offset,
            )
        )
    return records


def run_mode(
    llm: Any,
    mode: Literal["synchronous", "continuous"],
    point: str,
    spec: WorkloadSpec,
    chunk_size: int,
    device: Literal["cpu", "gpu"],
    startup_s: float,
) -> ModeRun:
    requests = generate(spec)
    records: list[RequestRecord] = []
    with PeakMemory(device) as memory:
        submitted = time.monotonic()
        if mode == "continuous":
            # A bar redrawn every few seconds: progress without burying the log.
            bar = functools.partial(tqdm, mininterval=5.0, desc=f"{point} continuous")
            records = _records(llm, requests, spec.detokenize, use_tqdm=bar)
        else:
            chunks = [requests[start : start + chunk_size] for start in range(0, len(requests), chunk_size)]
            for index, chunk in enumerate(chunks, start=1):
                records += _records(llm, chunk, spec.detokenize, use_tqdm=False)
                say(f"{point} synchronous: chunk {index}/{len(chunks)} done")
        finished = time.monotonic()
    return ModeRun(
        point=point,
        mode=mode,
        startup_s=startup_s,
        submitted=submitted,
        finished=finished,
        peak_memory_bytes=memory.peak_bytes,
        memory_source=memory.source,
        records=records,
        notes={
            **({"chunk_size": chunk_size} if mode == "synchronous" else {}),
            "cpu_seconds_by_process": memory.cpu_seconds,
            "peak_pss_mib_by_process": memory.peak_mib_by_role,
        },
    )


def run_engine_modes(
    kwargs: dict[str, Any],
    points: list[tuple[str, WorkloadSpec]],
    chunk_size: int,
    device: Literal["cpu", "gpu"],
    modes: tuple[Literal["continuous", "synchronous"], ...] = ("continuous", "synchronous"),
) -> list[ModeRun]:
    from vllm import LLM

    say("engine modes: starting the vLLM engine")
    started = time.monotonic()
    mark("engine_build_start")
    llm = LLM(**kwargs)
    mark("engine_ready")
    # One tiny generate first: the first step pays one-off allocations that would otherwise land on one mode.
    warmup = points[0][1].model_copy(update={"num_requests": 2})
    first = first_token_wall(_records(llm, generate(warmup), warmup.detokenize, use_tqdm=False))
    if first is not None:
        mark("first_token", at=first)
    startup_s = time.monotonic() - started
    say(f"engine modes: engine ready in {startup_s:.1f}s")
    runs = []
    for point, spec in points:
        for mode in modes:
            say(f"{point}: {mode} ({spec.num_requests} requests)")
            run = run_mode(llm, mode, point, spec, chunk_size, device, startup_s)
            say(f"{point}: {mode} done in {run.finished - run.submitted:.1f}s")
            runs.append(run)
    return runs
