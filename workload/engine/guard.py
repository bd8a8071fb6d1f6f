"""A bounded answer to an engine crash: retry the batch, then split it until the row(s) that kill the engine stand
alone, record those as `engine_crash` errors, and answer every other row.

Why a layer of ours: Ray Data LLM's engine stage meets a fatal vLLM error (EngineDeadError) with `os._exit(1)`
(ray/llm/_internal/batch/stages/vllm_engine_stage.py, `vLLMEngineStageUDF._generate_with_error_handling`, Ray
2.60), and Ray Data restarts the actor and replays the batch with `max_restarts=-1` and `max_task_retries=-1`
(ray/data/_internal/execution/operators/actor_pool_map_operator.py, `_apply_default_remote_args`). A row that
kills the engine therefore kills it forever, and `vLLMEngineProcessorConfig` exposes neither knob. This subclass
keeps the actor alive instead: it turns the fatal error into an exception of its own before upstream can exit,
rebuilds the engine in place with upstream's own constructor, and isolates the culprit. Ray's actor restarts are
still bounded (see `pipeline.guard_engine_stage`) for deaths this layer cannot see (an OOM kill of the actor, a lost
node); the batches of a restarted actor are retried on it, unbounded, as upstream does.

Rules, per engine replica:
- a batch that was running when the engine died is rerun alone (nothing else in flight on that engine), up to
  `crash_retries` times: a crash that depends on load (what else was batched with it) passes here;
- then it is halved, and each half run alone, recursively; a single row that still kills the engine is answered
  with an `engine_crash` error carrying the engine's message;
- if every row of the batch killed the engine on its own, the crash is tied to no row (a broken engine, not a
  poison row): the run fails with `EngineCrashLoopError` instead of recording the whole input as errors;
- more than `max_consecutive_crashes` engine deaths with no row answered in between also fail the run.

A stuck engine is a death too. An engine that has requests but makes no progress for `engine.hang_timeout_s`
(no scheduler step returns output: counted where vLLM's frontend receives each step's outputs, since the job asks
for final outputs only and a healthy long row shows nothing until it ends) fails every request it holds, and the
rules above run: a row that stalls the engine on its own is answered with an `engine_hang` error. Seen for real: a
request the engine core's input thread rejected (a float seed) killed that thread, the core process lived on, and
every later request waited forever.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import psutil
from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStageUDF, vLLMOutputData
from ray.llm._internal.common.errors import VLLM_FATAL_ERRORS

from workload import failpoints
from workload.contract.config import ModelConfig
from workload.contract.config import SamplingParams as JobSampling
from workload.engine.adapters import AdapterRoutes, adapter_folders
from workload.engine.auto_settings import (
    CALIBRATION_LINE,
    calibration_record,
    free_gpu_memory,
    settle,
    settled_summary,
)
from workload.engine.choices import engine_columns
from workload.engine.image_stage import with_images
from workload.engine.model_source import compile_cache_env
from workload.engine.node_stages import local_model
from workload.engine.reasoning import ROW_TEMPLATE_KWARGS, send_template_kwargs, splitter_for
from workload.files.results import (
    ENGINE_CALIBRATION_COLUMN,
    ENGINE_CRASH_PREFIX,
    ENGINE_FIRST_REQUEST_COLUMN,
    ENGINE_HANG_PREFIX,
    ENGINE_RESTARTS_COLUMN,
    EngineCrashLoopError,
)
from workload.files.template_args import TEMPLATE_KWARGS_COLUMN
from workload.files.tools import TOOLS_COLUMN
from workload.telemetry.engine_stats import EngineStats, attach, engine_reporter
from workload.telemetry.feed_trace import attach_trace
from workload.telemetry.startup_trace import mark

HANG_POLL_S = 1.0  # how often a pending request checks whether its engine has stalled


class _EngineDied(BaseException):
    """The engine died (or stalled: `hung`) under a request. A BaseException on purpose: upstream's per-row handler
    catches EngineDeadError (to exit the process) and Exception (to record a row error); this passes both
    untouched."""

    def __init__(self, message: str, hung: bool = False) -> None:
        super().__init__(message)
        self.message, self.hung = message, hung


class _Crash(Exception):
    """A run of rows ended with the engine dead or stalled; `generation` says which engine it was."""

    def __init__(self, message: str, generation: int, hung: bool = False, alone: bool = False) -> None:
        super().__init__(message)
        self.message, self.generation, self.hung = message, generation, hung
        self.alone = alone  # the rows ran with nothing else on the engine: the death is theirs


def describe_engine_error(error: BaseException) -> str:
    """The engine's own words, with the root cause when vLLM chained one."""
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__
    return f"{text} (cause: {type(cause).__name__}: {cause})" if cause is not None else text


_rebuilt_for_this_batch: ContextVar[list[str]] = ContextVar("rebuilt_for_this_batch")


class _Gate:
    """Batches share the engine; a batch under suspicion runs alone, so a crash during it is its own."""

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._condition:
                self._shared -= 1
                self._condition.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._condition:
            self._waiting += 1
            await self._condition.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._condition:
                self._exclusive = False
                self._condition.notify_all()


def _reader(splitter: Any, output: Any, chat_kwargs: Any, tools_json: Any) -> Callable[[Any], Any] | None:
    """vLLM's parsers over one sample of a chat row's output (workload/engine/reasoning.py); None elsewhere."""
    if chat_kwargs is None or output is None:
        return None
    prompt_ids = output.prompt_token_ids
    return lambda sample: splitter.split(sample.text, sample.token_ids, prompt_ids, chat_kwargs, tools_json)


class GuardedEngineUDF(vLLMEngineStageUDF):
    """Ray Data LLM's vLLM engine stage with crash isolation (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        crash_retries: int,
        max_consecutive_crashes: int,
        model_config: dict[str, Any],
        hang_timeout_s: float = 180.0,
        keep_metrics: bool = True,
        row_tokens: int = 600,
        metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # The model is fetched on this node, by this actor (workload/engine/node_stages.py says why not by upstream);
        # a rebuilt engine reuses the folder.
        mark("engine_actor_process_start", at=psutil.Process().create_time())
        mark("engine_build_start")
        kwargs["model"] = local_model(model_config)
        # The LoRA adapters too, before the engine starts: a missing one fails the actor's start by name. Only a
        # generating engine has LoRA slots (pipeline.engine_kwargs); an embedding one runs the base.
        generates = str(kwargs.get("task_type", "generate")) == "generate"
        model_settings = ModelConfig.model_validate(model_config)
        self._adapters = AdapterRoutes(adapter_folders(model_settings) if generates else {})
        # `auto` engine settings sized here, on the engine's own GPU, from the fetched model's config.json.
        kwargs["engine_kwargs"], plan = settle(kwargs["engine_kwargs"], kwargs["model"], row_tokens)
        if plan is not None:
            print(f"[llm-batch] engine sized: {plan.model_dump_json()}", flush=True)
        print(f"[llm-batch] engine settings: {settled_summary(kwargs['engine_kwargs'])}", flush=True)
        # Set before the engine starts: vLLM's engine-core process inherits this process's environment.
        os.environ.update(compile_cache_env(ModelConfig.model_validate(model_config)))
        self._engine_args = (args, kwargs)
        super().__init__(*args, **kwargs)
        mark("engine_ready")
        self._calibration = self._log_calibration(plan) if plan is not None else ""
        # vLLM's KV-cache use, preemptions, running and waiting requests, to CloudWatch (engine_stats.py).
        self._engine_stats = EngineStats(self.llm.get_scheduler_config().max_num_seqs)
        attach(self.llm.engine, self._engine_stats)
        self._engine_reporter = engine_reporter(metrics, self._engine_stats)
        self._rows_in_flight = 0  # rows of the batches this stage holds: the job's feed, as the engine sees it
        self._rows_open = 0  # of those, the rows asked of the engine and not yet back (feed_trace.py says why)
        attach_trace(self.llm.engine, self.llm.get_scheduler_config().max_num_seqs, self._feed_counts)
        self._keep_metrics = keep_metrics
        self._crash_retries = crash_retries
        self._max_consecutive_crashes = max_consecutive_crashes
        self._hang_timeout_s = hang_timeout_s
        self._pending = 0  # requests this engine holds
        self._progress_at = time.monotonic()  # when the engine last returned a step's outputs
        self._generation = 0  # bumped at each engine death
        self._consecutive_crashes = 0
        self._engine_dead = False
        self._gate = _Gate()
        self._first_request_at: float | None = None  # Unix time of this actor's first batch
        model = ModelConfig.model_validate(model_config)
        self._reasoning = model.reasoning  # vLLM's parser name, or None
        self._tool_parser = model.tools  # vLLM's tool-call parser, or None (validation refused rows with tools)
        self._guard_engine()

    # --- the engine ---------------------------------------------------------------------------------------
    def _log_calibration(self, plan: Any) -> str:
        """vLLM's KV-cache tokens beside the plan's (docs/gpu.md: calibration), logged and returned as JSON for
        the rows to carry to the run summary; never stops a start."""
        try:
            gpu = free_gpu_memory()
            record = json.dumps(calibration_record(plan, self.llm.engine.vllm_config, gpu[1] if gpu else ""))
        except Exception as error:  # a vLLM without these fields: the run goes on, the line says why
            print(f"{CALIBRATION_LINE}unavailable ({type(error).__name__}: {error})", flush=True)
            return ""
        print(CALIBRATION_LINE + record, flush=True)
        return record

    def _guard_engine(self) -> None:
        generate: Callable[[dict[str, Any]], Awaitable[Any]] = self.llm.generate_async
        generating = self.task_type == "generate"
        splitter = splitter_for(self._reasoning, self.llm.engine, self._tool_parser) if generating else None
        if splitter is not None and splitter.reads_reasoning:
            send_template_kwargs(self.llm.engine)

        async def guarded(row: dict[str, Any]) -> Any:
            try:
                if failpoints.crashes_engine_on(row.get("id")):
                    raise VLLM_FATAL_ERRORS[0]() from RuntimeError(
                        f"failpoint {failpoints.ENGINE_CRASH_ON_ROW}: row {row.get('id')!r}"
                    )
                with_images(row)
                chat_kwargs = row.get(TEMPLATE_KWARGS_COLUMN)  # set on chat rows only (pipeline.ApplyChatTemplate)
                ROW_TEMPLATE_KWARGS.set(chat_kwargs)  # this row's task's own value, read as its request is sent
                tools_json = row.get(TOOLS_COLUMN) if splitter is not None else None
                if splitter is not None and tools_json is not None:
                    # Forced calls through structured outputs, as vLLM's server sends them (engine/reasoning.py).
                    row["sampling_params"] = splitter.constrain(row["sampling_params"], chat_kwargs, tools_json)
                request, data, taken = await self._unless_stalled(generate(row))
                output = self._outputs.pop(request.request_id, None)
                split = None
                if splitter is not None and (splitter.reads_reasoning or tools_json is not None):
                    split = _reader(splitter, output, chat_kwargs, tools_json)

                choice = json.loads(tools_json)["tool_choice"] if tools_json is not None else None
                data.update(engine_columns(output, request.params, split, choice))
                return request, data, taken
            except VLLM_FATAL_ERRORS as error:
                raise _EngineDied(describe_engine_error(error)) from error

        self.llm.generate_async = guarded

        async def lora_request(row: dict[str, Any]) -> Any:
            return self._adapters.request_for(row)

        # Each row's LoRA adapter by the config's own routes (workload/engine/adapters.py says why not upstream's).
        self.llm._maybe_get_lora_request = lora_request
        self._outputs: dict[int, Any] = {}
        self._count_progress()
        self._final_outputs_only()
        if not generating:
            return  # a pooling output has no samples to keep (workload/engine/embed.py)
        respond = self.llm._generate_async

        async def keep_whole(request: Any) -> Any:
            # The whole output (every sample, finish reason, logprobs), which upstream narrows to outputs[0].
            output = await respond(request)
            self._outputs[request.request_id] = output
            return output

        self.llm._generate_async = keep_whole

    def _count_progress(self) -> None:
        """Note the time of every step's outputs as vLLM's frontend receives them from the engine core.

        AsyncLLM's output handler calls `output_processor.process_outputs` once per batch of step outputs
        (vllm/v1/engine/async_llm.py, `_run_output_handler`, vLLM 0.32), whatever output kind the requests asked
        for: the one place that sees a row's progress before the row ends. Without it the stall check would read
        a long healthy row as a hang, so its absence (another vLLM layout) stops the actor at once."""
        processor = getattr(getattr(self.llm, "engine", None), "output_processor", None)
        if processor is None or not hasattr(processor, "process_outputs"):
            raise RuntimeError("the engine has no output_processor.process_outputs to watch for progress")
        process = processor.process_outputs

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._progress_at = time.monotonic()
            return process(*args, **kwargs)

        processor.process_outputs = counted

    async def _unless_stalled(self, request: Awaitable[Any]) -> Any:
        """The request's result, unless the engine makes no progress for hang_timeout_s while it has requests."""
        if self._pending == 0:
            self._progress_at = time.monotonic()  # an idle engine shows no progress: the clock starts now
        self._pending += 1
        task = asyncio.ensure_future(request)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=HANG_POLL_S)
                if done:
                    return task.result()
                stalled = time.monotonic() - self._progress_at
                if stalled > self._hang_timeout_s:
                    raise _EngineDied(
                        f"no engine progress for {stalled:.0f} s with {self._pending} request(s) pending "
                        f"(engine.hang_timeout_s={self._hang_timeout_s:g})",
                        hung=True,
                    )
        finally:
            self._pending -= 1
            if not task.done():
                task.cancel()

    def _final_outputs_only(self) -> None:
        """Ask the engine for each row's final output only, as `vllm.LLM.generate` does for its own requests.

        Upstream sends rows with vLLM's default `RequestOutputKind.CUMULATIVE` and reads only the finished output
        (vllm_engine_stage.py, `_generate_async`, Ray 2.60): the engine's frontend then built a cumulative output for
        every running row at every decode step and woke that row's coroutine with it, work whose cost grows with the
        row's length. On 2 cores it competed with the engine for the CPU: in the bimodal benchmark the job's engine
        ran its decode steps 30-70% slower than a bare engine's (ITL p95 16-21 ms against 12 ms)."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        prepare = self.llm._prepare_llm_request

        async def final_only(row: dict[str, Any]) -> Any:
            row_id = row.get("id")
            if isinstance(row.get("sampling_params"), dict):
                # Arrow and numpy turned an int set in some rows only into a float; vLLM's core must get an int.
                row["sampling_params"] = JobSampling.restore_types(row["sampling_params"])
            request = await prepare(row)
            if isinstance(request.params, SamplingParams):
                request.params.output_kind = RequestOutputKind.FINAL_ONLY
                if failpoints.hangs_engine_on(row_id):
                    # The type slip the restore above prevents, on purpose: the core's input thread dies on it.
                    request.params.seed = float(request.params.seed or 0) + 0.5
            return request

        self.llm._prepare_llm_request = final_only

    def _rebuild_engine(self) -> None:
        """Shut the dead engine down (its processes would be orphaned otherwise) and build a new one exactly as
        upstream's constructor does."""
        try:
            self.llm.shutdown()
        except Exception as error:  # a dead engine may fail to shut down cleanly; its processes are gone anyway
            print(f"[llm-batch] engine shutdown after a crash: {error}", flush=True)
        args, kwargs = self._engine_args
        vLLMEngineStageUDF.__init__(self, *args, **kwargs)
        attach(self.llm.engine, self._engine_stats)
        attach_trace(self.llm.engine, self.llm.get_scheduler_config().max_num_seqs, self._feed_counts)
        self._guard_engine()

    def _feed_counts(self) -> dict[str, int]:
        return {"rows_in_flight": self._rows_in_flight, "rows_open": self._rows_open}

    def _died(self, crash: _Crash) -> None:
        """Note a death (once, however many batches saw it); the engine is rebuilt when rows next need it, so a
        verdict reached right after a death costs no engine start."""
        if crash.generation != self._generation:
            return  # another batch saw the same death
        self._generation += 1
        self._engine_dead = True
        self._consecutive_crashes += 1
        print(f"[llm-batch] engine died: {crash.message}", flush=True)
        if self._consecutive_crashes > self._max_consecutive_crashes:
            raise EngineCrashLoopError(
                f"the engine died {self._consecutive_crashes} times in a row with no row answered in between "
                f"(engine.max_consecutive_crashes={self._max_consecutive_crashes}); last: {crash.message}"
            )

    def _ensure_engine(self) -> None:
        if self._engine_dead:
            self._rebuild_engine()
            self._engine_dead = False
            _rebuilt_for_this_batch.get().append("rebuilt")

    # --- running rows -------------------------------------------------------------------------------------
    async def _run(self, rows: list[dict[str, Any]], alone: bool = True) -> list[dict[str, Any]]:
        """All rows on the current engine; raises _Crash if the engine dies under any of them. `alone`: nothing
        else runs on the engine meanwhile (the caller holds the exclusive gate)."""
        self._ensure_engine()
        generation, batch_uuid = self._generation, uuid.uuid4()
        # Upstream's request builder pops keys off the row it is given (prompt, sampling_params, ...): hand it a
        # copy, so a rerun sees the row whole and every row leaves the stage with the same columns.
        tasks = [asyncio.ensure_future(self._open_row(copy.deepcopy(row), batch_uuid)) for row in rows]
        try:
            outputs = list(await asyncio.gather(*tasks))
        except _EngineDied as death:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise _Crash(death.message, generation, death.hung, alone) from None
        self._consecutive_crashes = 0
        return outputs

    async def _open_row(self, row: dict[str, Any], batch_uuid: uuid.UUID) -> dict[str, Any]:
        """One row asked of the engine, counted open until its answer (or its cancellation) is back."""
        self._rows_open += 1
        try:
            return await self._generate_with_error_handling(row, batch_uuid)
        finally:
            self._rows_open -= 1

    def _crash_output(self, row: dict[str, Any], crash: _Crash) -> dict[str, Any]:
        # The same shape as upstream's error rows, so every row of the stage's output has one schema.
        empty = vLLMOutputData(prompt=str(row.get("prompt") or "")[:200], prompt_token_ids=None, num_input_tokens=0)
        return {
            **empty.model_dump(),
            "request_id": -1,
            self.IDX_IN_BATCH_COLUMN: row[self.IDX_IN_BATCH_COLUMN],
            "batch_uuid": uuid.uuid4().hex,
            "time_taken_llm": -1,
            "params": "",
            "__inference_error__": (
                f"{ENGINE_HANG_PREFIX}{crash.message} (the engine stalled on this row alone)"
                if crash.hung
                else f"{ENGINE_CRASH_PREFIX}{crash.message} (the engine died on this row alone)"
            ),
        }

    async def _split(self, rows: list[dict[str, Any]], crash: _Crash) -> list[dict[str, Any]]:
        if len(rows) == 1:
            if not crash.alone:  # a bystander of another batch's death is blamed only if it dies alone too
                try:
                    return await self._run(rows)
                except _Crash as own:
                    self._died(own)
                    crash = own
            return [self._crash_output(rows[0], crash)]
        middle = len(rows) // 2
        outputs: list[dict[str, Any]] = []
        for half in (rows[:middle], rows[middle:]):
            try:
                outputs += await self._run(half)
            except _Crash as half_crash:
                self._died(half_crash)
                outputs += await self._split(half, half_crash)
        return outputs

    async def _isolate(self, rows: list[dict[str, Any]], crash: _Crash) -> list[dict[str, Any]]:
        for _ in range(self._crash_retries):
            try:
                return await self._run(rows)
            except _Crash as again:
                crash = again
                self._died(crash)
        outputs = await self._split(rows, crash)
        prefixes = (ENGINE_CRASH_PREFIX, ENGINE_HANG_PREFIX)
        if len(rows) > 1 and all(o["__inference_error__"].startswith(prefixes) for o in outputs):
            raise EngineCrashLoopError(
                f"every row of a batch of {len(rows)} killed the engine on its own: the crash is tied to no row. "
                f"Last engine error: {crash.message}"
            )
        return outputs

    async def _answer(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            async with self._gate.shared():
                return await self._run(rows, alone=False)
        except _Crash as crash:
            self._died(crash)  # at once, so no batch starts on the dead engine meanwhile
            first = crash
        async with self._gate.exclusive():
            return await self._isolate(rows, first)

    async def udf(self, batch: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        if self._first_request_at is None:
            self._first_request_at = time.time()
        rebuilt: list[str] = []
        _rebuilt_for_this_batch.set(rebuilt)  # this call runs in its own asyncio task, with its own context
        self._rows_in_flight += len(batch)
        try:
            outputs = await self._answer(batch)
        finally:
            self._rows_in_flight -= len(batch)
        # The driver learns of engine deaths from the rows (actor logs may never reach it): the engine rebuilds this
        # batch made ride on its first row, so each is counted once.
        for index, output in enumerate(outputs):
            output[ENGINE_RESTARTS_COLUMN] = len(rebuilt) if index == 0 else 0
            output[ENGINE_FIRST_REQUEST_COLUMN] = self._first_request_at
            output[ENGINE_CALIBRATION_COLUMN] = self._calibration if index == 0 else ""
            if not self._keep_metrics or (output.get("__inference_error__") and output.get("metrics") is None):
                # `metrics` is the one struct the engine adds. Where a batch's rows all lack it (failed rows, or a
                # row that skipped the engine, as a chat-template rejection does, which a later stage fills with
                # None), Arrow types it as null, and Ray Data cannot then join that batch with others whose
                # `metrics` is a struct (its _backfill_missing_fields recurses into the null column). The job
                # never reads it, so only the benchmark, whose rows all reach the engine, keeps it.
                output.pop("metrics", None)
            yield output
