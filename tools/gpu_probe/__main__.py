"""`python3 -m gpu_probe --plan plan.json --out DIR [--dry]`: the probe's steps, each written to DIR/probe.json as
it ends. Without --dry it needs CUDA; --dry runs the same steps on the CPU for a tiny plan (the suite's check)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch

from . import device as devices
from .models import activations
from .rates import decode_step, rates
from .record import Record

# The lent machine's session is 15 minutes, start-up included; the probe stops starting new measurements here.
DEFAULT_BUDGET_S = 480


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpu_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan.json from `python -m tools.gpu_probe_kit plan`")
    parser.add_argument("--out", type=Path, required=True, help="folder for probe.json")
    parser.add_argument("--dry", action="store_true", help="on the CPU, for a tiny plan: shapes and JSON only")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="start no measurement after this")
    args = parser.parse_args(argv)
    plan: dict[str, Any] = json.loads(args.plan.read_text())
    if args.dry:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        print("gpu_probe: no CUDA device; run it on a GPU machine, or --dry with a tiny plan", file=sys.stderr)
        return 2
    if plan.get("tiny") != args.dry:
        print("gpu_probe: --dry goes with a tiny plan (gpu_probe_kit plan --tiny), and only with one", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget_s
    reps = 2 if args.dry else 20
    args.out.mkdir(parents=True, exist_ok=True)
    record = Record(
        args.out / "probe.json",
        {
            "probe": "gpu_probe",
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "dry": args.dry,
            "plan": {key: plan[key] for key in ("written", "commit", "gpu_kinds_checked", "tiny")},
        },
    )
    torch.manual_seed(0)
    info = record.run("device", lambda: devices.describe(device, plan["gpu_kinds"]))
    kind = (info or {}).get("kind")
    for name, model_plan in plan["models"].items():
        record.run(f"activations:{name}", partial(activations, model_plan, device, args.dry, deadline))
    record.run("rates", lambda: rates(plan, device, reps, deadline))
    record.run("decode", lambda: decode_step(plan, kind, device, reps, args.dry))
    record.finish()
    print(f"gpu_probe: wrote {args.out / 'probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
