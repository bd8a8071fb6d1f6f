"""`python -m workload engine-plan`: vLLM's settings for a model on a GPU kind, from its config.json alone.

JSON on stdout (workload/contract/engine_sizing.py's EnginePlan); exit 1 with the fix named when the model cannot
fit; exit 2 for a source with no readable config.json.
"""

from __future__ import annotations

import argparse
import sys

from workload.contract.adapter_config import VLLM_LORA_RANKS, slot_rank
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
    parser.add_argument(
        "--adapters", type=int, default=0, help="LoRA adapters served beside the model (model.adapters; default 0)"
    )
    parser.add_argument(
        "--adapter-rank", type=int, default=16, help="the adapters' largest LoRA rank (default 16; with --adapters)"
    )


def run(args: argparse.Namespace) -> int:
    from workload.engine.auto_settings import model_config_json

    try:
        shape = ModelShape.from_config(model_config_json(args.model), args.model.rstrip("/").rsplit("/", 1)[-1])
    except SizingError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_BAD_SOURCE
    if args.adapters < 0 or not 1 <= args.adapter_rank <= VLLM_LORA_RANKS[-1]:
        print(
            f"llm-batch: --adapters must be 0 or more and --adapter-rank 1 to {VLLM_LORA_RANKS[-1]}, got "
            f"{args.adapters} and {args.adapter_rank}",
            file=sys.stderr,
        )
        return EXIT_BAD_SOURCE
    # One slot per adapter on a GPU, as the job builds its engine (workload/contract/adapter_config.py).
    lora = (args.adapters, slot_rank([args.adapter_rank])) if args.adapters else None
    try:
        plan = plan_engine(
            shape,
            args.gpu,
            args.gpus,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            row_tokens=args.row_tokens,
            tensor_parallel_size=args.tensor_parallel_size,
            lora=lora,
        )
    except SizingError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_CANNOT_FIT
    print(plan.model_dump_json(indent=2))
    return 0
