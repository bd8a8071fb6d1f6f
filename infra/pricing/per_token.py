"""Cost per million output tokens of a stack, beside managed batch list prices (managed_batch.json), like for like.

For each model class of the table and each GPU pool of the stack's nightly run: the engine plan of the job
(workload/contract/engine_sizing.py, the tier's GPU kind and GPUs per instance, the layout it chooses), the output
tokens/s of its engines by the same roofline the layout is chosen by (engine_sizing.layout_speed: rows of the
table's `row_tokens`, two thirds prompt, prefilled in the engine's time), and from them

- GPU-time $/1M: the instance's Spot hour (the price table's) over the output tokens its engines produce in that hour;
- all-in $/1M: the stack's whole monthly estimate (head nodes, control plane, NAT, storage, monitoring included)
  over the output tokens the month's nightly GPU hours produce, at full load: a floor, reached only by a night that
  keeps every engine busy for its hours;
- managed $/1M: each comparable's bill for the same rows, input and output tokens, per 1M output tokens.
"""

from __future__ import annotations

from datetime import date
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.pricing.estimate import Estimate, EstimateInputs
from infra.pricing.table import PriceTable
from workload.contract.engine_sizing import (
    EnginePlan,
    ModelShape,
    SizingError,
    kind_of_instance,
    layout_speed,
    plan_engine,
)

MANAGED_TABLE = Path(__file__).with_name("managed_batch.json")


class ManagedPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_1m: float = Field(gt=0)
    output_per_1m: float = Field(gt=0)
    comparable: str = Field(description="The model class of model_classes it is compared with")


class ManagedService(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    models: dict[str, ManagedPrice]


class Throughput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field(min_length=40)
    efficiency: float = Field(gt=0, le=1)
    efficiency_source: str = Field(min_length=40)
    row_tokens: int = Field(gt=0)


class ManagedTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: date
    currency: str = Field(pattern=r"^USD$")
    source: str = Field(min_length=40)
    how: str = Field(min_length=10)
    services: dict[str, ManagedService]
    throughput: Throughput
    model_classes: dict[str, dict[str, Any]]

    def shape(self, model_class: str) -> ModelShape:
        return ModelShape.from_config(self.model_classes[model_class], model_class)


@cache
def managed_table() -> ManagedTable:
    return ManagedTable.model_validate_json(MANAGED_TABLE.read_text())


class TokenCost(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_class: str
    instance_type: str
    gpu: str
    fits: bool
    why_not: str | None = None
    tensor_parallel_size: int | None = None
    engines_per_instance: int | None = None
    tokens_per_s_per_engine: float | None = Field(None, description="Decode-bound estimate (managed_batch.json)")
    gpu_time_per_1m: float | None = None
    all_in_per_1m: float | None = None
    managed: dict[str, float] = Field(
        default_factory=dict, description="Comparable list prices: the stated rows' input and output, per 1M output"
    )


def decode_tokens_per_s(plan: EnginePlan, gpu: str, shape: ModelShape, throughput: Throughput) -> float:
    """Output tokens/s of one engine whose max_num_seqs rows all run: engine_sizing.layout_speed, the roofline the
    layout is chosen by, at the table's efficiency and row shape (two thirds prompt, prefilled in the engine's time)."""
    prompt = throughput.row_tokens * 2 // 3
    return layout_speed(
        shape,
        gpu,
        plan.tensor_parallel_size,
        plan.max_num_seqs,
        plan.engines_per_node,
        prompt,
        throughput.row_tokens - prompt,
        efficiency=throughput.efficiency,
    ).engine_tokens_per_s


def row_shape(throughput: Throughput) -> tuple[int, int]:
    """The stated row: (prompt, output) tokens, two thirds of row_tokens prompt (400 in / 200 out at 600)."""
    prompt = throughput.row_tokens * 2 // 3
    return prompt, throughput.row_tokens - prompt


def _comparables(table: ManagedTable, model_class: str) -> dict[str, float]:
    """Each comparable's price per 1M output tokens of the stated rows, their input tokens billed too: a GPU hour
    prefills the prompts and decodes the outputs, so its $/1M output tokens is compared with the same rows' bill."""
    prompt, output = row_shape(table.throughput)
    return {
        f"{service.label}: {name}": round(price.output_per_1m + price.input_per_1m * prompt / output, 4)
        for service in table.services.values()
        for name, price in service.models.items()
        if price.comparable == model_class
    }


def per_token_costs(
    inputs: EstimateInputs, result: Estimate, prices: PriceTable, table: ManagedTable | None = None
) -> list[TokenCost]:
    table = table or managed_table()
    gpu_pools = [pool for pool in inputs.nightly_pools if kind_of_instance(pool.instance_type)]
    rows: list[TokenCost] = []
    for model_class in table.model_classes:
        shape = table.shape(model_class)
        plans: list[tuple[Any, EnginePlan, float, float]] = []
        for pool in gpu_pools:
            gpu = kind_of_instance(pool.instance_type) or ""
            price = prices.instance(inputs.region, pool.instance_type)
            hourly = price.spot_hourly if pool.capacity == "spot" else price.on_demand_hourly
            base = {"model_class": model_class, "instance_type": pool.instance_type, "gpu": gpu}
            try:
                plan = plan_engine(shape, gpu, price.gpus, row_tokens=table.throughput.row_tokens)
            except SizingError as error:
                rows.append(TokenCost(**base, fits=False, why_not=str(error), managed=_comparables(table, model_class)))
                continue
            speed = decode_tokens_per_s(plan, gpu, shape, table.throughput)
            per_hour = speed * plan.engines_per_node * 3600
            plans.append((pool, plan, speed, per_hour))
            rows.append(
                TokenCost(
                    **base,
                    fits=True,
                    tensor_parallel_size=plan.tensor_parallel_size,
                    engines_per_instance=plan.engines_per_node,
                    tokens_per_s_per_engine=round(speed, 1),
                    gpu_time_per_1m=round(hourly / per_hour * 1e6, 4),
                    managed=_comparables(table, model_class),
                )
            )
        monthly_tokens = sum(pool.count * pool.hours_per_month * per_hour for pool, _, _, per_hour in plans)
        if monthly_tokens:
            all_in = round(result.total / monthly_tokens * 1e6, 4)
            rows = [
                r.model_copy(update={"all_in_per_1m": all_in}) if r.model_class == model_class and r.fits else r
                for r in rows
            ]
    return rows


def format_per_token(rows: list[TokenCost], table: ManagedTable | None = None) -> str:
    table = table or managed_table()
    prompt, output = row_shape(table.throughput)
    lines = [
        f"Cost per 1M output tokens of {prompt}-in/{output}-out rows (roofline estimate, prefill in the engine's time; "
        f"managed list prices of {table.as_of} on the same rows' input and output):"
    ]
    for row in rows:
        managed = ", ".join(f"{name} {price:g}" for name, price in row.managed.items())
        if not row.fits:
            lines.append(f"  {row.model_class} on {row.instance_type}: does not fit ({row.why_not})")
            continue
        lines.append(
            f"  {row.model_class} on {row.instance_type} ({row.engines_per_instance} x tp{row.tensor_parallel_size}, "
            f"~{row.tokens_per_s_per_engine:,.0f} tok/s an engine): GPU time {row.gpu_time_per_1m:.3f}, "
            f"all-in at full load {row.all_in_per_1m:.3f}; managed: {managed}"
        )
    lines.append("  throughput: infra/pricing/managed_batch.json `throughput` (measure: tools/gpu_check.py)")
    return "\n".join(lines)
