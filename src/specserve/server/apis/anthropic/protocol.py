"""Anthropic's Messages request bodies as pydantic models.

`MessagesRequest` checks a /v1/messages (or /v1/messages/count_tokens) body: `system` (a string or
text blocks), `messages` of content blocks (text, tool_use, tool_result, thinking), `stop_sequences`,
`tools` (`{"name", "description", "input_schema"}`), `tool_choice` (auto, any, tool, none),
`thinking`, `output_config`, and the shared fields (sampling, `speculative`, constraints:
shared/fields.Generation). Every refusal is a 400 naming the field by its path.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...core.constraints.structured import schema_grammar
from ...core.constraints.tools import NAME
from ...http.errors import bad_request
from ..shared.generation_fields import MAX_STOP, MAX_STOP_LEN, GenerationFields
from ..shared.validation import Fields


class TextBlock(Fields):
    type: Literal["text"]
    text: str


class ToolUseBlock(Fields):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolResultBlock(Fields):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list | None = None
    is_error: bool | None = None


class ThinkingBlock(Fields):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class Message(Fields):
    role: Literal["user", "assistant"]
    content: str | list


class AnthropicTool(Fields):
    """A client tool. Anthropic's server tools (`{"type": "web_search_20250305", ...}`) are refused."""

    name: str = Field(pattern=NAME.pattern)
    description: str | None = None
    input_schema: dict
    type: str | None = None


class ToolChoice(Fields):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Fields):
    """Extended thinking: `enabled` with a budget of reasoning tokens, `disabled`, `adaptive` or
    `between_tools` (the model decides)."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None

    @model_validator(mode="after")
    def _budget(self):
        if self.type == "enabled" and (self.budget_tokens is None or self.budget_tokens < 1):
            raise bad_request("thinking.budget_tokens must be a positive integer when thinking is enabled",
                              "thinking.budget_tokens")
        return self


class JsonFormat(Fields):
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")  # `schema` would shadow BaseModel.schema


class OutputConfig(Fields):
    """Structured output (`format`: the answer is JSON valid against `schema`) and the effort asked for."""

    format: JsonFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class MessagesRequest(GenerationFields):
    messages: list | None = None
    system: str | list | None = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    metadata: dict | None = None  # accepted (Anthropic's user_id); nothing here reads it

    @model_validator(mode="after")
    def _stops(self):
        """stop_sequences join the shared `stop` (what the engine stops at), under its limits: the two
        together, so that a request stops at no more strings here than on another API."""
        stops = self.stop_sequences or []
        joined = tuple(dict.fromkeys([*self.stop, *(s for s in stops if s)]))
        if max(len(stops), len(joined)) > MAX_STOP or any(len(s) > MAX_STOP_LEN for s in stops):
            raise bad_request(f"stop_sequences (with stop) takes at most {MAX_STOP} strings of at most "
                              f"{MAX_STOP_LEN} characters", "stop_sequences")
        self.stop = joined
        return self

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        return None, self.reasoning_budget()

    def format_grammar(self) -> tuple[str, str] | None:
        """(param, grammar) of output_config.format, for constraint_fields.output_grammar."""
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is None:
            return None
        return "output_config.format", schema_grammar(fmt.schema_, "output_config.format.schema")

    def reasoning_budget(self) -> int | None:
        """The reasoning budget in tokens (GenRequest.reasoning_budget): `enabled`'s budget_tokens, 0 for
        `disabled` (the block closed at once), else None (the server's --reasoning-budget)."""
        if self.thinking is None or self.thinking.type in ("adaptive", "between_tools"):
            return None
        return self.thinking.budget_tokens if self.thinking.type == "enabled" else 0
