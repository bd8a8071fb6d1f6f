"""One short GPU check for a maintainer: a real model's shape with dummy weights, the job's engine settings, and
throughput and memory written to a JSON file.

    python tools/gpu_check.py --out gpu-check.json                 # Llama-3.1-8B's shape, about 5 minutes
    python tools/gpu_check.py --model DIR --out gpu-check.json     # any folder with a config.json
    python tools/gpu_check.py --dry-run --gpu a10g                 # no GPU: the settings it would run, sized for a10g

What it runs: vLLM's offline engine with `load_format: dummy` (random weights of the config's shape: nothing to
download), `skip_tokenizer_init` (prompts are token ids), and the job's own engine arguments: the config's defaults
on a GPU (workload/engine/pipeline.engine_kwargs) with `auto` settled the way the engine actor settles them at
start (workload/engine/auto_settings.settle: the model's config.json and the GPU's real free memory). Rows of
`row_tokens` (two thirds prompt, one third output, ignore_eos), four times max_num_seqs of them. Then the same rows
at the job's earlier fixed max_num_seqs (128), unless --no-baseline: over-admission shows as preemptions there.

Each engine runs in a process of its own (`--engine-run`): two vLLM engines in one process share one CUDA context
and the first one's memory is not all given back, so the second would be sized from less than a fresh engine sees.
The rows are fed through the engine's own step loop, which polls vLLM's KV-cache use (at most every 0.5 s) and
keeps its peak: read after the run, the gauge shows an empty cache. The JSON is rewritten after each step (the
plan, each run), so a run cut off keeps what it measured.

The JSON: the GPU, driver and versions; the sizing plan (predicted KV-cache tokens) beside vLLM's own (its
num_gpu_blocks x block_size); per run: engine build seconds, output tokens/s, preemptions, peak KV-cache use, peak
GPU memory (NVML). Nothing here is needed to run the job; it is how docs/gpu.md's estimates get measured figures.
Install: docs/gpu.md ("The GPU check").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_MODEL = ROOT / "tests" / "workload" / "data" / "model_configs" / "llama-3.1-8b-instruct"


def job_engine_kwargs(model_dir: Path, row_tokens: int, memory: tuple[int, str] | None) -> tuple[dict[str, Any], Any]:
    from workload.contract.config import build_config
    from workload.engine import auto_settings
    from workload.engine.pipeline import engine_kwargs

    config = build_config({"input": {"uri": "-"}, "output": {"uri": "out"}, "device": "gpu"})
    kwargs = {**engine_kwargs(config, keep_auto=True), "load_format": "dummy", "skip_tokenizer_init": True}
    # The grammar backend needs a tokenizer, which a dummy model has none of; no row here asks for structure.
    kwargs.pop("structured_outputs_config", None)
    # `memory` (--dry-run): a GPU kind's total instead of the real free memory.
    return auto_settings.settle(kwargs, str(model_dir), row_tokens, memory)


def _nvml_used() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    finally:
        pynvml.nvmlShutdown()


KV_POLL_S = 0.5


def run_engine(model_dir: Path, kwargs: dict[str, Any], rows: int, row_tokens: int) -> dict[str, Any]:
    """One engine in this process: build, feed `rows` rows through its step loop, poll the KV-cache use."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.monotonic()
    llm = LLM(model=str(model_dir), disable_log_stats=False, **kwargs)
    built = time.monotonic() - started
    engine = llm.llm_engine
    prompt, output = row_tokens * 2 // 3, row_tokens - row_tokens * 2 // 3
    sampling = SamplingParams(max_tokens=output, ignore_eos=True, detokenize=False, temperature=0.0)
    for i in range(rows):
        tokens = [(7 * i + j) % 30000 + 100 for j in range(prompt)]
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=tokens), sampling)
    started = time.monotonic()
    polled, kv_peak, produced = 0.0, 0.0, 0
    while engine.has_unfinished_requests():
        for answer in engine.step():
            if answer.finished:
                produced += len(answer.outputs[0].token_ids)
        if time.monotonic() - polled >= KV_POLL_S:
            polled = time.monotonic()
            kv_peak = max(kv_peak, float(_metrics(llm).get("vllm:kv_cache_usage_perc") or 0.0))
    wall = time.monotonic() - started
    metrics = _metrics(llm)
    cache = engine.vllm_config.cache_config
    return {
        "engine_build_s": round(built, 1),
        "rows": rows,
        "output_tokens": produced,
        "wall_s": round(wall, 2),
        "output_tokens_per_s": round(produced / wall, 1),
        "preemptions": metrics.get("vllm:num_preemptions"),
        "kv_cache_usage_peak": kv_peak,
        "kv_cache_poll_s": KV_POLL_S,
        "vllm_kv_cache_tokens": (cache.num_gpu_blocks or 0) * cache.block_size,
        "gpu_memory_used_gib": round(_nvml_used() / 2**30, 2),
        "engine_kwargs": {k: v for k, v in kwargs.items() if not isinstance(v, dict)},
    }


def _metrics(llm: Any) -> dict[str, Any]:
    return {m.name: getattr(m, "value", None) for m in llm.get_metrics()}


def engine_in_subprocess(model_dir: Path, kwargs: dict[str, Any], rows: int, row_tokens: int) -> dict[str, Any]:
    """run_engine in a fresh process (one engine a process); its result, or its exit and last lines."""
    spec = {"model": str(model_dir), "kwargs": kwargs, "rows": rows, "row_tokens": row_tokens}
    spec_path = Path(f"gpu-check-engine-{os.getpid()}.json")
    spec_path.write_text(json.dumps(spec, default=str))
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--engine-run", str(spec_path)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            return {"error": f"engine process exited {done.returncode}", "stderr_tail": done.stderr[-4000:]}
        return dict(json.loads(spec_path.read_text())["result"])
    finally:
        spec_path.unlink(missing_ok=True)


def _engine_run(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    result = run_engine(Path(spec["model"]), spec["kwargs"], spec["rows"], spec["row_tokens"])
    spec_path.write_text(json.dumps({**spec, "result": result}, default=str))
    return 0


def _write(path: Path, report: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu_check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a folder with a config.json")
    parser.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    parser.add_argument("--row-tokens", type=int, default=600)
    parser.add_argument("--no-baseline", action="store_true", help="skip the run at the earlier max_num_seqs 128")
    parser.add_argument("--dry-run", action="store_true", help="print the settings; start no engine")
    parser.add_argument("--gpu", default="a10g", help="with --dry-run: the GPU kind to size for")
    parser.add_argument("--engine-run", type=Path, help=argparse.SUPPRESS)  # the child process of one engine
    args = parser.parse_args(argv)
    if args.engine_run:
        return _engine_run(args.engine_run)
    from workload.contract.engine_sizing import MIB, SizingError, gpu_kind
    from workload.engine.auto_settings import free_gpu_memory

    gpu = free_gpu_memory()
    if gpu is None and not args.dry_run:
        print("gpu_check: no NVIDIA GPU visible (NVML); run it on a GPU machine, or --dry-run", file=sys.stderr)
        return 2
    memory = (gpu_kind(args.gpu).memory_mib * MIB, args.gpu) if args.dry_run else gpu
    try:
        kwargs, plan = job_engine_kwargs(args.model, args.row_tokens, memory)
    except SizingError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"model": str(args.model), "plan": plan.model_dump() if plan else None}
    if args.dry_run:
        print(json.dumps({**report, "engine_kwargs": kwargs}, indent=1, default=str))
        return 0
    import pynvml
    import torch
    import vllm

    pynvml.nvmlInit()
    report["gpu"] = {"name": gpu[1] if gpu else None, "driver": pynvml.nvmlSystemGetDriverVersion()}
    pynvml.nvmlShutdown()
    report["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__, "cuda": torch.version.cuda}
    _write(args.out, report)
    rows = 4 * int(kwargs["max_num_seqs"])
    report["sized"] = engine_in_subprocess(args.model, kwargs, rows, args.row_tokens)
    _write(args.out, report)
    if not args.no_baseline:
        fixed = {**kwargs, "max_num_seqs": 128}
        report["fixed_128"] = engine_in_subprocess(args.model, fixed, rows, args.row_tokens)
        _write(args.out, report)
    print(f"wrote {args.out}: {report['sized'].get('output_tokens_per_s')} output tok/s at the sized settings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
