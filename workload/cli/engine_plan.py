"""`python -m workload engine-plan`: vLLM's settings for a model on a GPU kind, from its config.json alone.

JSON on stdout (workload/contract/engine_sizing.py's EnginePlan); exit 1 with the fix named when the model cannot
fit; exit 2 for a source with no readable config.json.
"""

from __future__ import annotations

import argparse
import json
import sys

from workload.contract.adapter_config import VLLM_LORA_RANKS, slot_rank
from workload.contract.engine_sizing import (
    DEFAULT_ROW_TOKENS,
    MIB,
    ModelShape,
    SizingError,
    gpu_kind,
    gpu_kinds,
    plan_engine,
)
from workload.contract.vision_shape import VisionPlan, encoder_weight_bytes, vision_plan

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
    parser.add_argument("--images-per-row", type=int, default=0, help="a vision model's images in a typical row")
    parser.add_argument("--image-size", type=int, default=512, help="their side in pixels, square (default 512)")
    parser.add_argument(
        "--adapters", type=int, default=0, help="LoRA adapters served beside the model (model.adapters; default 0)"
    )
    parser.add_argument(
        "--adapter-rank", type=int, default=16, help="the adapters' largest LoRA rank (default 16; with --adapters)"
    )


def run(args: argparse.Namespace) -> int:
    from workload.engine.auto_settings import model_config_json

    name = args.model.rstrip("/").rsplit("/", 1)[-1]
    try:
        config = model_config_json(args.model)
        shape = ModelShape.from_config(config, name)
        vision = vision_plan(config, args.images_per_row, args.image_size, name) if args.images_per_row else None
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
            **_with_images(vision, args),
            tensor_parallel_size=args.tensor_parallel_size,
            lora=lora,
        )
    except SizingError as error:
        print(f"llm-batch: {error}", file=sys.stderr)
        return EXIT_CANNOT_FIT
    print(json.dumps({**plan.model_dump(), **({"vision": vision.model_dump()} if vision else {})}, indent=2))
    return 0


def _with_images(vision: VisionPlan | None, args: argparse.Namespace) -> dict[str, int]:
    """A row's image tokens join its prompt (so row_tokens), and the encoder's weights leave the GPU memory the
    language model and its KV cache are sized from (every GPU holds the encoder: vLLM does not shard small ones)."""
    if vision is None:
        return {"row_tokens": args.row_tokens}
    prompt = args.row_tokens * 2 // 3 + vision.image_tokens_per_row  # plan_engine's default prompt share, plus images
    memory = gpu_kind(args.gpu).cuda_total_mib * MIB - encoder_weight_bytes(vision)
    return {
        "row_tokens": args.row_tokens + vision.image_tokens_per_row,
        "prompt_tokens": prompt,
        "memory_bytes": memory,
    }
