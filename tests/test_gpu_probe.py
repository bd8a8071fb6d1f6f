"""The GPU probe (tools/gpu_probe) in its dry mode: the kit written from the project's numbers, the probe run from a
copy of it the way the lent GPU machine runs it (its own process, the project not importable), its JSON step by
step, and the proposal. The GPU figures themselves need a GPU: here the CPU runs tiny shapes, and a probe.json
as an H100 would write it is made by hand for the proposal (docs/gpu.md)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.gpu_probe.device import match_kind
from tools.gpu_probe.record import Record
from tools.gpu_probe_kit import build_plan, write_kit
from tools.gpu_probe_proposal import proposal
from workload.contract.engine_sizing import ModelShape, gpu_kinds, plan_engine

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = set(sys.stdlib_module_names) | {"torch", "transformers"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    kit = tmp_path_factory.mktemp("probe") / "kit"
    size = write_kit(kit, tiny=True)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_probe", "--plan", "plan.json", "--out", "result", "--dry"],
        cwd=kit, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return kit, size, json.loads((kit / "result" / "probe.json").read_text())


def test_the_dry_run_measures_every_step_at_the_plans_shapes(dry_run: tuple[Path, int, dict[str, Any]]) -> None:
    kit, size, result = dry_run
    assert size < 64 * 2**20 and sorted(p.name for p in kit.iterdir()) == ["gpu_probe", "plan.json", "result"]
    assert result["status"] == "done" and result["dry"] and result["running"] is None
    steps = result["steps"]
    assert list(steps) == [
        "device", "activations:llama-3.1-8b-instruct", "activations:mixtral-8x7b-instruct", "rates", "decode",
    ]  # fmt: skip
    assert not [name for name, step in steps.items() if "error" in step]
    plan = json.loads((kit / "plan.json").read_text())
    for name, model in plan["models"].items():
        measured = steps[f"activations:{name}"]
        # The layers built, counted and scaled to all layers, weigh what engine_sizing predicts for the shape.
        assert measured["weight_bytes_scaled"] == measured["weight_bytes_predicted"] == model["weight_bytes"]
        (step,) = measured["steps"]
        assert (step["input"], step["hidden"], step["logits"]) == ([4, 16], [4, 16, 64], [4, 256])
        assert step["predicted_bytes"] == model["steps"][0]["predicted_bytes"] > 0
    assert [row["batch"] for row in steps["rates"]["by_batch"]] == [1, 4]
    assert all(row["gemm"]["ms"] > 0 and row["attention"]["ms"] > 0 for row in steps["rates"]["by_batch"])
    assert steps["decode"]["max_num_seqs"] == 4 and steps["decode"]["step_ms"] > 0
    text = proposal(result)
    assert result["started"] in text and "cpu (dry run)" in text and steps["device"]["host"] in text
    assert "mixtral-8x7b-instruct | 64 | 4 |" in text and "no GPU peak measured" in text


def test_a_run_cut_off_mid_step_keeps_the_steps_it_finished(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    record = Record(path, {"probe": "gpu_probe"})
    seen: dict[str, Any] = {}

    def second() -> dict[str, Any]:
        seen.update(json.loads(path.read_text()))  # what a kill at this moment would leave
        raise RuntimeError("CUDA out of memory")

    record.run("device", lambda: {"name": "NVIDIA H100 80GB HBM3"})
    record.run("activations:x", second)
    assert seen["running"] == "activations:x" and seen["status"] == "running"
    assert seen["steps"]["device"]["name"] == "NVIDIA H100 80GB HBM3"
    after = json.loads(path.read_text())
    assert "RuntimeError: CUDA out of memory" in after["steps"]["activations:x"]["error"]


def test_the_probe_imports_nothing_but_the_standard_library_torch_and_transformers() -> None:
    for path in (ROOT / "tools" / "gpu_probe").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert {name.split(".")[0] for name in names} <= ALLOWED, (path.name, names)


def test_device_names_match_the_kinds_table() -> None:
    kinds = {name: kind.model_dump() for name, kind in gpu_kinds().kinds.items()}
    mib = 2**20
    assert match_kind("NVIDIA H100 80GB HBM3", 81559 * mib, kinds) == "h100"
    assert match_kind("NVIDIA H200", 143771 * mib, kinds) == "h200"
    assert match_kind("NVIDIA A100-SXM4-40GB", 40960 * mib, kinds) == "a100-40gb"
    assert match_kind("NVIDIA A100-SXM4-80GB", 81920 * mib, kinds) == "a100-80gb"
    assert match_kind("NVIDIA L40S", 46068 * mib, kinds) is None


def test_the_real_plan_carries_engine_plans_budgets() -> None:
    plan = build_plan()
    dense = plan["models"]["llama-3.1-8b-instruct"]
    h100 = plan_engine(
        ModelShape.from_config(dense["config"], "llama-3.1-8b-instruct"), "h100", row_tokens=plan["row_tokens"]
    ).max_num_seqs
    assert {"max_num_batched_tokens": 16384, "max_num_seqs": h100} in [
        {k: s[k] for k in ("max_num_batched_tokens", "max_num_seqs")} for s in dense["steps"]
    ]
    assert plan["decode"]["batch_sizes"][0] == 1 and plan["decode"]["batch_sizes"][-1] == 1024
    assert plan["decode"]["max_num_seqs"]["h100"] == h100 and plan["decode"]["context"] == 300


def test_a_gpu_result_proposes_the_kinds_row_the_reserve_and_the_efficiency() -> None:
    """A probe.json as an H100 would write it, by hand: no GPU here."""
    result = {
        "started": "2027-01-04T10:00:00+00:00",
        "dry": False,
        "status": "done",
        "plan": {"written": "2027-01-04", "commit": "abc1234"},
        "steps": {
            "device": {"name": "NVIDIA H100 80GB HBM3", "host": "gpu-7", "torch": "2.11.0", "cuda": "13.0",
                       "transformers": "5.2.0", "total_mib": 81000, "free_mib": 80500, "kind": "h100",
                       "compute_capability": "9.0"},
            "activations:llama-3.1-8b-instruct": {
                "layers": 32, "layers_built": 32, "weight_bytes_scaled": 2**34, "weight_bytes_predicted": 2**34,
                "steps": [{"max_num_batched_tokens": 16384, "max_num_seqs": 737, "predicted_bytes": 2**30,
                           "step_bytes": int(1.23 * 2**30), "measured_over_predicted": 1.23}],
            },
            "decode": {"model": "llama-3.1-8b-instruct", "max_num_seqs": 737, "context": 300, "step_ms": 30.0,
                       "forward_ms": 20.0, "attention_ms": 10.0, "tokens_per_s": 24566.7, "roofline_ms": 22.0,
                       "roofline_tokens_per_s": 33500.0, "measured_efficiency": 0.45},
        },
    }  # fmt: skip
    text = proposal(result)
    assert text.startswith("GPU probe of 2027-01-04T10:00:00+00:00 on NVIDIA H100 80GB HBM3 (gpu-7;")
    assert '-  "cuda_total_mib": 81090\n+  "cuda_total_mib": 81000' in text
    assert "500 MiB of RESERVE_GIB" in text
    assert "+        return int(1.25 * max(forward, sampler))" in text
    assert 'managed_batch.json, throughput:\n-  "efficiency": 0.6\n+  "efficiency": 0.45' in text
