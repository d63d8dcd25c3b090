"""OpenAI's tools on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls` -> a ToolRequest.

The shapes (protocol.py) are checked as OpenAI checks them (StrictModel: unknown fields refused, OpenAI's codes);
the call form, grammar and reading back are the core's (core/constraints/). The tools go to the chat
template as they were sent: Hugging Face templates take OpenAI's form.
"""
from __future__ import annotations

from typing import Any

from ...core.constraints.tools import ToolRequest, ToolSpec, tool_request
from ...http.errors import bad_request
from ..shared.validation import parse
from .protocol import NamedChoice, Tool


def _choice(value, names: tuple[str, ...]) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(f"Invalid value for 'tool_choice': {value!r}. Supported values are: 'none', 'auto', "
                              "'required', or an object naming a function.", "tool_choice", "invalid_value")
        return value
    named = parse(NamedChoice, value, "tool_choice")
    if named.function.name not in names:
        raise bad_request(f"tool_choice names the function {named.function.name!r}, which is not among the tools "
                          f"({', '.join(names)})", "tool_choice.function.name", "invalid_value")
    return named.function.name


def openai_tools(raw: list[dict] | None, tools: list[Tool] | None, choice: Any, parallel: bool | None,
                 messages: list, model) -> ToolRequest | None:
    """The request's tools as a ToolRequest (None without tools). `raw`: the tools as sent, `tools`:
    the same validated. Raises ApiError(400) naming the field."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    names = tuple(t.function.name for t in tools)
    specs = [ToolSpec(t.function.name, t.function.parameters, f"tools[{i}].function.name",
                      f"tools[{i}].function.parameters") for i, t in enumerate(tools)]
    # parallel_tool_calls left out: one call, as llama-server's default (OpenAI's is true). Small local
    # models given room for more go on calling (the same function again, or with other arguments) until
    # max_tokens; an agent that wants several calls in one turn says so
    return tool_request(model, raw, specs, _choice(choice, names), bool(parallel))
