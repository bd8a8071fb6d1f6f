"""Benchmark profiles: the model, engine arguments, workload and sweep of a run, as data.

`cpu` is sized for the embedded tiny model on a 2-core machine; `gpu` gives a real architecture
(Llama-3.1-8B's shape) random weights through vLLM's `load_format="dummy"`, so its speed is measurable with
no weights to download;
`smoke` is the test suite's minute-long run; `scale` runs the real job at growing input sizes instead
(workload/bench/scale.py). Every mode of a run uses the same model and engine arguments.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workload.bench.generator import TokenRange, WorkloadSpec
from workload.contract.config import EngineConfig, JobConfig, StagesConfig
from workload.engine.tiny_model import ensure_tiny_model

# Llama-3.1-8B's architecture (from its public config.json): only the shape matters with dummy weights.
LLAMA_3_1_8B_SHAPE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Prompt words become at most this many tokens with the tiny tokenizer (checked by a test), for the length
# check.
TOKENS_PER_WORD_BOUND = 4


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tiny", "shape"] = Field(
        description="'tiny': the embedded tiny Llama; 'shape': a real architecture with dummy weights."
    )
    shape: dict[str, Any] | None = Field(None, description="config.json of the architecture, for kind 'shape'.")
    name: str = Field(description="How the scorecard names the model.")

    @model_validator(mode="after")
    def _shape_given(self) -> ModelSpec:
        if (self.kind == "shape") != (self.shape is not None):
            raise ValueError("model.shape is required for kind 'shape' and only for it")
        return self

    @property
    def load_format(self) -> Literal["auto", "dummy"]:
        return "dummy" if self.kind == "shape" else "auto"


class JobSettings(BaseModel):
    """How the job (mode 3) feeds the engine: the knobs that are ours, not vLLM's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(ge=1)
    # `auto`: the job's own feed, sized from the engine (workload/engine/feed.py); a number pins it.
    max_concurrent_batches: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    stages: StagesConfig = StagesConfig(tokenize_on_cpu=False)


class BenchProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    device: Literal["cpu", "gpu"]
    model: ModelSpec
    engine: EngineConfig
    workload: WorkloadSpec
    sweep_long_tokens: list[int] = Field(
        default_factory=list, description="Long-decode lengths of the sweep (each a run of all three modes)."
    )
    job: JobSettings
    sync_chunk: int | None = Field(None, ge=1, description="Synchronous chunk size; None: max_num_seqs.")
    scale_rows: list[int] = Field(
        default_factory=list,
        description="Input sizes of a scale run (workload/bench/scale.py): the real job at each size instead of "
        "the three modes; empty for the engine-comparison profiles.",
    )
    scale_input: Literal["local", "s3"] = Field(
        "local",
        description="Where a scale run's input lies: local files, or a bucket on a counting moto server "
        "(workload/bench/counted_s3.py), which adds the job's S3 requests and bytes read to each size's figures.",
    )

    @model_validator(mode="after")
    def _fits_context(self) -> BenchProfile:
        longest_decode = max([self.workload.long_tokens.max, self.workload.short_tokens.max, *self.sweep_long_tokens])
        longest_prompt = self.workload.prompt_words_max * TOKENS_PER_WORD_BOUND + 16
        if longest_decode + longest_prompt > self.engine.max_model_len:
            raise ValueError(
                f"profile {self.name}: the longest decode ({longest_decode}) plus the longest prompt "
                f"(~{longest_prompt} tokens) exceeds engine.max_model_len ({self.engine.max_model_len})"
            )
        return self

    @property
    def chunk_size(self) -> int:
        return self.sync_chunk or self.engine.unsized_max_num_seqs

    def points(self) -> list[tuple[str, WorkloadSpec]]:
        """(label, workload) of each run: the bimodal headline first, then the sweep."""
        runs = [("bimodal", self.workload)]
        runs += [(f"long={tokens}", self.workload.with_long(tokens)) for tokens in self.sweep_long_tokens]
        return runs

    def job_config(self, model_path: str, run_dir: Path) -> JobConfig:
        """The job's config for this profile: the same engine arguments the engine modes use."""
        return JobConfig.model_validate(
            {
                "input": {"uri": str(run_dir / "input")},
                "output": {"uri": str(run_dir / "output")},
                "model": {"source": model_path, "load_format": self.model.load_format},
                "engine": self.engine.model_dump(),
                "stages": self.job.stages.model_dump(),
                "device": self.device,
                "batch_size": self.job.batch_size,
                "max_concurrent_batches": self.job.max_concurrent_batches,
            }
        )


def materialise_model(model: ModelSpec, cache_dir: Path) -> Path:
    """The folder vLLM loads: the tiny model, or a shape's config.json with the tiny tokenizer beside it.

    A dummy-weight model needs a tokenizer only to turn prompts into ids; the tiny one gives ids in range of
    any vocabulary, and the profile turns detokenizing off where the model's vocabulary is larger than it.
    """
    tiny = ensure_tiny_model(cache_dir)
    if model.kind == "tiny":
        return tiny
    assert model.shape is not None
    target = cache_dir / f"shape-{model.name}"
    target.mkdir(parents=True, exist_ok=True)
    for item in tiny.iterdir():
        if "token" in item.name or item.name == "special_tokens_map.json":
            shutil.copy2(item, target / item.name)
    (target / "config.json").write_text(json.dumps(model.shape, indent=2))
    return target


# The GPU profiles' bimodal point: ~50-token answers beside 100-2,000-token reasoning traces, 3 in 10 long.
_GPU_BIMODAL = WorkloadSpec(
    num_requests=2048,
    seed=0,
    long_fraction=0.3,
    short_tokens=TokenRange(min=30, max=70),
    long_tokens=TokenRange(min=100, max=2000),
    prompt_words_max=400,
    detokenize=False,
)
_TINY = ModelSpec(kind="tiny", name="tiny-llama (0.4M params, random weights)")

PROFILES: dict[str, BenchProfile] = {
    "cpu": BenchProfile(
        name="cpu",
        description="Embedded tiny Llama on the CPU (2 cores): bimodal, 30% long traces; a length sweep.",
        device="cpu",
        model=_TINY,
        engine=EngineConfig(max_model_len=2048, max_num_seqs=32, enforce_eager=True, cpu_kvcache_space_gib=2),
        workload=WorkloadSpec(
            num_requests=256,
            seed=0,
            long_fraction=0.3,
            short_tokens=TokenRange(min=32, max=64),
            long_tokens=TokenRange(min=128, max=1024),
            prompt_words_max=128,
        ),
        sweep_long_tokens=[128, 256, 512, 1024],
        job=JobSettings(batch_size=32, max_concurrent_batches=4),
    ),
    "gpu": BenchProfile(
        name="gpu",
        description="Llama-3.1-8B shape, dummy weights, one GPU: ~50-token answers, 100-2,000-token traces.",
        device="gpu",
        model=ModelSpec(kind="shape", shape=LLAMA_3_1_8B_SHAPE, name="llama-3.1-8b-shape"),
        engine=EngineConfig(max_model_len=4096, max_num_seqs=256, gpu_memory_utilization=0.90, dtype="bfloat16"),
        workload=_GPU_BIMODAL,
        sweep_long_tokens=[250, 500, 1000, 2000],
        job=JobSettings(batch_size=64, max_concurrent_batches=8),
    ),
    "gpu-15min": BenchProfile(
        name="gpu-15min",
        description="Llama-3.1-8B shape, dummy weights, one GPU, about 15 minutes: the bimodal point and one "
        "long-decode point (1,000-token traces) at max_num_seqs 512, the job on the product's default feed.",
        device="gpu",
        model=ModelSpec(kind="shape", shape=LLAMA_3_1_8B_SHAPE, name="llama-3.1-8b-shape"),
        # Pinned, not `auto`: the bare engine modes run unsized (workload/engine/auto_settings.py), and every mode
        # must get the same engine; 512 is what `auto` gives an 8B on an A100-80GB, below an H100's ~737.
        engine=EngineConfig(
            max_model_len=4096,
            max_num_seqs=512,
            max_num_batched_tokens=8192,
            gpu_memory_utilization=0.90,
            dtype="bfloat16",
        ),
        workload=_GPU_BIMODAL,
        sweep_long_tokens=[1000],
        job=JobSettings(batch_size=32, max_concurrent_batches="auto"),
    ),
    "smoke": BenchProfile(
        name="smoke",
        description="The test suite's run: a few dozen short requests, one engine start per mode.",
        device="cpu",
        model=_TINY,
        engine=EngineConfig(max_model_len=512, max_num_seqs=8, enforce_eager=True, cpu_kvcache_space_gib=1),
        workload=WorkloadSpec(
            num_requests=32,
            seed=0,
            long_fraction=0.25,
            short_tokens=TokenRange(min=4, max=8),
            long_tokens=TokenRange(min=48, max=64),
            prompt_words_median=8,
            prompt_words_max=32,
        ),
        job=JobSettings(batch_size=8, max_concurrent_batches=4),
    ),
    "scale": BenchProfile(
        name="scale",
        description="The real job at 20,000 and 200,000 short rows (max_tokens 1, a few percent bad and repeated "
        "rows) on the tiny Llama: driver memory, time to the first engine request, wall time, resume time.",
        device="cpu",
        model=_TINY,
        engine=EngineConfig(max_model_len=256, max_num_seqs=128, enforce_eager=True, cpu_kvcache_space_gib=1),
        workload=WorkloadSpec(
            num_requests=1,  # unused: a scale run writes its own input (workload/bench/scale.py)
            seed=0,
            long_fraction=0.0,
            short_tokens=TokenRange(min=1, max=1),
            long_tokens=TokenRange(min=1, max=1),
            prompt_words_median=4,
            prompt_words_max=8,
        ),
        job=JobSettings(batch_size=256, max_concurrent_batches=4, stages=StagesConfig(tokenize_on_cpu=False)),
        scale_rows=[20_000, 200_000],
    ),
}


def get_profile(name: str) -> BenchProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown benchmark profile {name!r}; choose one of: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]
