"""`python -m workload engine-plan`: vLLM's settings for a model on a GPU kind, from its config.json alone.

JSON on stdout (workload/contract/engine_sizing.py's EnginePlan); exit 1 with the fix named when the model cannot
fit; exit 2 for a source with no readable config.json.
"""

from __future__ import annotations

import argparse
import sys

from workload.contract.engine_sizing import DEFAULT_ROW_TOKENS, ModelShape, SizingError, gpu_kinds, plan_engine

EXIT_CANNOT_FIT = 1
EXIT_BAD_SOURCE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder, s3:// prefix or Hugging Face hub id")
    parser.add_argument("--gpu", required=True, choices=sorted(gpu_kinds().kinds), help="GPU kind")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs on the node (default 1)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="longest prompt + output (default 2048)")
    parser.add_argument(
        "--row-tokens", type=int, default=DEFAULT_ROW_TOKENS, help="a typical row's prompt + output tokens"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.90, help="vLLM's share of GPU memory")
    parser.add_argument("--tensor-parallel-size", type=int, help="pin it (default: the fastest layout that fits)")


def run(args: argparse.Namespace) -> int:
    from workload.engine.auto_settings import model_config_json

    try:
        shape = ModelShape.from_config(model_config_json(args.model), args.model.rstrip("/").rsplit("/", 1)[-1])
    except SizingError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_BAD_SOURCE
    try:
        plan = plan_engine(
            shape,
            args.gpu,
            args.gpus,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            row_tokens=args.row_tokens,
            tensor_parallel_size=args.tensor_parallel_size,
        )
    except SizingError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_CANNOT_FIT
    print(plan.model_dump_json(indent=2))
    return 0
