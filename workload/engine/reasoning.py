"""A chat answer read by vLLM's own parsers in the engine stage (which holds the engine's tokenizer and every
sample's token ids): a thinking model's thinking apart from its answer (reasoning parser), and a row with tools'
calls (tool-call parser, issue 56), composed into one parser as vLLM's server composes them.

It runs the parser as vLLM's OpenAI server does on a finished chat answer (vllm/entrypoints/openai/chat_completion/
serving.py, `chat_completion_full_generator`, vLLM 0.32): the composed parser class of `ParserManager.get_parser`
(the harmony parser for a gpt_oss model, as the server picks it), a new instance per sample (parsers keep state),
built with the row's chat-template variables (Qwen3's parser reads `enable_thinking`: with thinking off the whole
text is the answer), told the prompt's token ids, then `parse` for (reasoning, content) and
`count_reasoning_tokens` over the sample's token ids. Nothing here matches the text itself.

A row with tools is sent as vLLM's server sends it: the parser's `adjust_request` on the row's request sets the
structured output that forces a `required` or named call (a JSON schema, or, for a parser with a structural tag such
as `hermes`, xgrammar's structural tag of its `<tool_call>` format) and keeps special tokens in the text; `parse`
then reads the calls (vllm/parser/abstract_parser.py, `DelegatingParser`, vLLM 0.32).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Split:
    reasoning: str | None  # the thinking; None where the sample has none (thinking off, or none written)
    content: str | None  # the answer; None where the sample is all thinking (it ran out of tokens thinking)
    reasoning_tokens: int | None  # None where no reasoning parser ran (a row with tools, on a model without one)
    # The calls vLLM's tool parser read, {"id", "name", "arguments"} each; None where the row gave no tools.
    tool_calls: list[dict[str, str]] | None = None


class ReasoningSplitter:
    """One per engine: vLLM's reasoning parser `name` and tool-call parser `tools` (either may be None) composed
    over the engine's tokenizer."""

    def __init__(self, name: str | None, engine: Any, tools: str | None = None) -> None:
        from vllm.parser.parser_manager import ParserManager

        self._tokenizer = engine.get_tokenizer()
        self._model_config = engine.model_config
        self.reads_reasoning = name is not None
        self._parser_cls = ParserManager.get_parser(
            tool_parser_name=tools,
            reasoning_parser_name=name,
            # What `--enable-auto-tool-choice` turns on: a row's `auto` choice is read by the tool parser.
            enable_auto_tools=tools is not None,
            model_name=self._model_config.model,
            is_harmony=self._model_config.hf_config.model_type == "gpt_oss",
            tokenizer=self._tokenizer,
        )
        if self._parser_cls is None:  # get_parser answers None only when asked for no parser at all
            raise ValueError(f"vLLM has no reasoning parser {name!r} or tool-call parser {tools!r}")

    def _request(self, kwargs: dict[str, Any], tools_json: Any) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        # The request as far as the parser reads it: its chat-template variables and tools (the messages were
        # rendered already; a placeholder satisfies the model).
        return ChatCompletionRequest(
            model=self._model_config.model,
            messages=[{"role": "user", "content": ""}],
            chat_template_kwargs=kwargs or None,
            **(json.loads(tools_json) if tools_json else {}),
        )

    def _parser(self, request: Any, kwargs: dict[str, Any]) -> Any:
        # As vLLM's server makes one per request (chat_completion/serving.py, `_make_parser`): parsers keep state.
        return self._parser_cls(
            self._tokenizer, request.tools, chat_template_kwargs=kwargs, model_config=self._model_config
        )

    def constrain(self, sampling: dict[str, Any], kwargs_json: Any, tools_json: Any) -> dict[str, Any]:
        """A row with tools' sampling keys as vLLM's server sets them: the parser's `adjust_request` may force the
        call (structured outputs, as JSON text like the row's own) and keep special tokens in the text."""
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
        request = self._request(kwargs, tools_json)
        request = self._parser(request, kwargs).adjust_request(request)
        out = dict(sampling)
        if request.structured_outputs is not None:
            given = request.structured_outputs
            kind = next(k for k in ("structural_tag", "json") if getattr(given, k, None) is not None)
            out["structured_outputs"] = json.dumps({kind: getattr(given, kind)})
        if request.skip_special_tokens is False:
            out["skip_special_tokens"] = False
        return out

    def split(
        self,
        text: str,
        token_ids: Sequence[int],
        prompt_ids: Sequence[int] | None,
        kwargs_json: Any,
        tools_json: Any = None,
    ) -> Split:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
        request = self._request(kwargs, tools_json)
        parser = self._parser(request, kwargs)
        if prompt_ids is not None:
            parser.set_prompt_token_ids(list(prompt_ids))
        reasoning, content, calls = parser.parse(
            text, request, enable_auto_tools=tools_json is not None, model_output_token_ids=list(token_ids)
        )
        counted = int(parser.count_reasoning_tokens(list(token_ids))) if self.reads_reasoning else None
        found = None
        if tools_json is not None:
            # vLLM's server gives a call the parser left without an id one of its own (make_tool_call_id).
            from vllm.renderers.chat_utils import make_tool_call_id

            found = [{"id": c.id or make_tool_call_id(), "name": c.name, "arguments": c.arguments} for c in calls or []]
        return Split(reasoning, content, counted, found)


def splitter_for(name: str | None, engine: Any, tools: str | None = None) -> ReasoningSplitter | None:
    return None if name is None and tools is None else ReasoningSplitter(name, engine, tools)


# The chat-template variables of the row whose request is being sent, as JSON (None: not a chat row), set by the
# engine stage around each row's request (workload/engine/guard.py).
ROW_TEMPLATE_KWARGS: ContextVar[str | None] = ContextVar("row_template_kwargs", default=None)


def send_template_kwargs(engine: Any) -> None:
    """Give the engine's own reasoning parser each chat row's template variables, as vLLM's server does
    (serving.py, `_engine_reasoning_kwargs`: `reasoning_parser_kwargs={"chat_template_kwargs": ...}`): the
    parser that gates a structured output then knows whether thinking was on (Qwen3's with `enable_thinking:
    false` starts in the answer). Ray Data LLM's engine stage calls `engine.generate` without them (vllm_engine_stage.
    py, `_generate_async`, Ray 2.60), so this engine's `generate` adds them for the row being sent."""
    plain = engine.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        chat = ROW_TEMPLATE_KWARGS.get()
        if chat is not None:
            kwargs["reasoning_parser_kwargs"] = {"chat_template_kwargs": json.loads(chat)}
        return plain(*args, **kwargs)

    engine.generate = generate
