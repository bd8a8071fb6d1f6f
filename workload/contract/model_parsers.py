"""The model's parsers (ModelConfig's `reasoning_parser` and `tool_call_parser`): which of vLLM's parsers read a
thinking model's thinking and a model's tool calls out of its text. A mixin of ModelConfig
(workload/contract/config.py), kept here so config.py stays one concern; the choice rule is parser_choice.py's.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from workload.contract.parser_choice import AUTO
from workload.contract.reasoning import check_reasoning_parser, resolve_reasoning_parser
from workload.contract.tool_calls import check_tool_parser, resolve_tool_parser


class ParserModel(BaseModel):
    """Needs `source` (the model's hub id or path) from the model it is mixed into."""

    reasoning_parser: str = Field(
        AUTO,
        description="vLLM's reasoning parser for a thinking model (its `--reasoning-parser` names), which puts the "
        "thinking apart from the answer (`reasoning` in OpenAI chat bodies, in `choices` of native results) and "
        "lets structured outputs constrain the answer only. 'auto': by the model's name (Qwen3 thinking models: "
        "qwen3; DeepSeek-R1 and its distills: deepseek_r1; gpt-oss: openai_gptoss; any other, and the embedded "
        "tiny model: none). 'none': the model's text is the answer, thinking and all (docs/job.md, 'Reasoning "
        "models').",
    )
    tool_call_parser: str = Field(
        AUTO,
        description="vLLM's tool-call parser (its `--tool-call-parser` names), which reads `tools` answers into "
        "`message.tool_calls`. 'auto': by the model's name (workload/contract/tool_calls.py: Qwen and Hermes: "
        "hermes; the embedded tiny model: hermes; unknown: none). 'none': a line with `tools` is refused, naming why.",
    )

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _known_parser(cls, value: str, info: ValidationInfo) -> str:
        return check_reasoning_parser(value) if info.field_name == "reasoning_parser" else check_tool_parser(value)

    @property
    def reasoning(self) -> str | None:
        """The vLLM reasoning parser the engine runs with, or None."""
        return resolve_reasoning_parser(self.reasoning_parser, self._source())

    @property
    def tools(self) -> str | None:
        """The vLLM tool-call parser the engine stage reads tool calls with, or None (tools are refused)."""
        return resolve_tool_parser(self.tool_call_parser, self._source())

    def _source(self) -> str | None:
        return getattr(self, "source", None)
