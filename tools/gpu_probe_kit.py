"""The GPU probe's two ends on this machine: the kit that travels to a GPU, and the proposal from what it measured.

    python -m tools.gpu_probe_kit plan --out gpu-probe-kit        # plan.json + a copy of tools/gpu_probe/
    python -m tools.gpu_probe_kit propose result/probe.json       # the proposed edits, dated, naming the machine

The probe (tools/gpu_probe/) cannot import the project (no pydantic where it runs), so `plan` writes the project's
own numbers into plan.json from the code that uses them: the GPU kinds table, engine-plan's token budgets and
sequence counts per kind for a dense 8B and a MoE (the smallest GPU count that fits), the predicted activation
bytes (engine_sizing.ModelShape.activation_bytes at tensor parallel 1: the probe has one GPU), the weights and KV
bytes a token, and the roofline's efficiency and row tokens. `--tiny` writes the same for shapes the CPU runs in
seconds (the suite's dry run). docs/gpu.md says how to run it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from infra.pricing.per_token import managed_table  # noqa: E402
from tools.gpu_probe_proposal import proposal  # noqa: E402
from workload.contract.engine_sizing import ModelShape, SizingError, gpu_kinds, plan_engine  # noqa: E402

PROBE = ROOT / "tools" / "gpu_probe"
MODELS = ROOT / "tests" / "workload" / "data" / "model_configs"
DENSE, MOE = "llama-3.1-8b-instruct", "mixtral-8x7b-instruct"
DECODE_BATCHES = [2**i for i in range(11)]  # 1 to 1,024: vLLM's largest default max_num_seqs
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


def _tiny(config: dict[str, Any]) -> dict[str, Any]:
    shrunk = {**config, **TINY}
    if "num_local_experts" in config:
        shrunk["num_local_experts"] = 4
    return shrunk


def _budgets(shape: ModelShape, row_tokens: int) -> list[dict[str, Any]]:
    """engine-plan's picks on every kind, at the smallest GPU count that fits; one entry per distinct pair."""
    seen: dict[tuple[int, int], dict[str, Any]] = {}
    for kind in gpu_kinds().kinds:
        for gpus in (1, 2, 4, 8):
            try:
                plan = plan_engine(shape, kind, gpus, row_tokens=row_tokens)
            except SizingError:
                continue
            pair = (plan.max_num_batched_tokens, plan.max_num_seqs)
            seen.setdefault(pair, {"kinds": [], "tp": plan.tensor_parallel_size})["kinds"].append(kind)
            break
    return [{"max_num_batched_tokens": b, "max_num_seqs": s, **where} for (b, s), where in sorted(seen.items())]


def _model(name: str, tiny: bool, row_tokens: int) -> dict[str, Any]:
    config = json.loads((MODELS / name / "config.json").read_text())
    config = _tiny(config) if tiny else config
    shape = ModelShape.from_config(config, name)
    tiny_budget: dict[str, Any] = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "kinds": ["cpu"], "tp": 1}
    steps = [tiny_budget] if tiny else _budgets(shape, row_tokens)
    for step in steps:
        batched, seqs = step["max_num_batched_tokens"], step["max_num_seqs"]
        step["predicted_bytes"] = shape.activation_bytes(batched, seqs, 1)
        step["predicted_logits_bytes"] = seqs * shape.vocab_size * 4
    return {
        "config": config,
        "weight_bytes": shape.weight_bytes(),
        "kv_bytes_per_token": shape.kv_bytes_per_token(1),
        "steps": steps,
    }


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def build_plan(tiny: bool = False) -> dict[str, Any]:
    kinds = gpu_kinds()
    throughput = managed_table().throughput
    dense = ModelShape.from_config(json.loads((MODELS / DENSE / "config.json").read_text()), DENSE)
    seqs = {kind: plan_engine(dense, kind, row_tokens=throughput.row_tokens).max_num_seqs for kind in kinds.kinds}
    return {
        "written": date.today().isoformat(),
        "commit": _commit(),
        "tiny": tiny,
        "gpu_kinds_checked": kinds.checked.isoformat(),
        "gpu_kinds": {name: kind.model_dump() for name, kind in kinds.kinds.items()},
        "efficiency": throughput.efficiency,
        "row_tokens": throughput.row_tokens,
        "models": {name: _model(name, tiny, throughput.row_tokens) for name in (DENSE, MOE)},
        "decode": {
            "model": DENSE,
            "batch_sizes": [1, 4] if tiny else DECODE_BATCHES,
            "context": 16 if tiny else throughput.row_tokens // 2,  # the roofline's average context
            "max_num_seqs": {"default": 4} if tiny else {**seqs, "default": seqs["h100"]},
        },
    }


def write_kit(out: Path, tiny: bool = False) -> int:
    """plan.json and the probe's sources in `out`; returns the kit's size in bytes."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(PROBE, out / "gpu_probe", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (out / "plan.json").write_text(json.dumps(build_plan(tiny), indent=1) + "\n")
    return sum(path.stat().st_size for path in out.rglob("*") if path.is_file())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_probe_kit", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="write the kit that travels to the GPU machine")
    plan.add_argument("--out", type=Path, default=Path("gpu-probe-kit"))
    plan.add_argument("--tiny", action="store_true", help="shapes the CPU runs in seconds (with the probe's --dry)")
    propose = commands.add_parser("propose", help="the proposed edits from a probe.json")
    propose.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    if args.command == "plan":
        size = write_kit(args.out, args.tiny)
        print(
            f"wrote {args.out} ({size} bytes); on the GPU: "
            f"cd {args.out} && python3 -m gpu_probe --plan plan.json --out result"
        )
        return 0
    print(proposal(json.loads(args.result.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
