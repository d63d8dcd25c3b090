"""Anthropic's Messages request: its pydantic models, and the body as the chat the templates take.

`MessagesRequest` checks a /v1/messages (or /v1/messages/count_tokens) body: `system` (a string or
text blocks), `messages` of content blocks (text, tool_use, tool_result, thinking), `stop_sequences`,
`tools` (`{"name", "description", "input_schema"}`), `tool_choice` (auto, any, tool, none),
`thinking`, and the shared fields (sampling, `speculative`, constraints: fields.Generation).
`chat_messages` turns system and messages into OpenAI's chat form, which `GenRequest.messages`
holds and chat templates render; `tool_request` reads the tools into the core's ToolRequest. Every
refusal is a 400 naming the field by its path (`messages[2].content[0].tool_use_id`).
"""
from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import Field, model_validator

from ...core.constraints.structured import schema_grammar
from ...core.constraints.tools import NAME, ToolRequest, ToolSpec
from ...core.constraints.tools import tool_request as core_tool_request
from ...http.errors import bad_request
from ..shared.fields import MAX_STOP, MAX_STOP_LEN, Generation
from ..shared.validation import Fields, parse

# Claude Code's first system block carries a per-request stamp (`cch=ab12f;`) that would end every
# prompt's cached prefix there; it means nothing to a local model, so it is fixed (as llama-server does).
_BILLING_STAMP = re.compile(r"^(x-anthropic-billing-header:[^\n]*?cch=)[0-9a-zA-Z]+;")


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


# which role may send which block, and its model; redacted_thinking is accepted and dropped (its
# text is encrypted by Anthropic for Anthropic's models: nothing a local model can read)
_BLOCKS = {"text": (TextBlock, ("user", "assistant")), "tool_use": (ToolUseBlock, ("assistant",)),
           "tool_result": (ToolResultBlock, ("user",)), "thinking": (ThinkingBlock, ("assistant",)),
           "redacted_thinking": (None, ("assistant",))}


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


class MessagesRequest(Generation):
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


def system_text(system: str | list | None) -> str | None:
    """`system` as one string: a string, or text blocks joined (cache_control and the like ignored)."""
    if system is None:
        return None
    if isinstance(system, str):
        texts = [system]
    else:
        texts = [parse(TextBlock, block, f"system[{i}]").text for i, block in enumerate(system)]
    return "\n".join(_BILLING_STAMP.sub(r"\1fffff;", t) for t in texts)


def _result_text(block: ToolResultBlock, where: str) -> str:
    """A tool_result's content as text: a string, or its text blocks joined."""
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    texts = []
    for k, part in enumerate(block.content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise _unsupported(kind, f"{where}.content[{k}]")
        texts.append(parse(TextBlock, part, f"{where}.content[{k}]").text)
    return "".join(texts)


def _unsupported(kind, where: str):
    return bad_request(f"{where}: content blocks of type {json.dumps(kind)[:40]} are not supported: this server reads "
                       "text, tool_use, tool_result and thinking blocks (image input is not supported)", where,
                       "unsupported_parameter")


def _message(i: int, m: Message) -> list[dict]:
    """One Anthropic message as chat messages: a user's tool_result blocks become `tool` messages (in
    their order among its text), an assistant's tool_use blocks its `tool_calls`, thinking its
    `reasoning_content` (what reasoning templates render)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict] = []
    text, calls, thinking = [], [], []
    for j, raw in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind not in _BLOCKS:
            raise _unsupported(kind, where)
        model, roles = _BLOCKS[kind]
        if m.role not in roles:
            raise bad_request(f"{where}: a {m.role} message cannot carry a {kind} block", f"{where}.type")
        if model is None:
            continue
        block = parse(model, raw, where)
        if kind == "text":
            text.append(block.text)
        elif kind == "thinking":
            thinking.append(block.thinking)
        elif kind == "tool_use":
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        else:  # tool_result: the text before it is a user message of its own
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block, where)})
    if m.role == "user":
        return out + ([{"role": "user", "content": "".join(text)}] if text or not out else [])
    msg: dict = {"role": "assistant", "content": "".join(text)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return [msg]


def chat_messages(fields: MessagesRequest) -> list[dict]:
    """system + messages in OpenAI's chat form. 400 naming the field for what cannot be rendered."""
    if not fields.messages:
        raise bad_request("messages must be a non-empty array", "messages")
    system = system_text(fields.system)
    out = [{"role": "system", "content": system}] if system is not None else []
    for i, raw in enumerate(fields.messages):
        out += _message(i, parse(Message, raw, f"messages[{i}]"))
    return out


def template_tools(fields: MessagesRequest) -> list[dict]:
    """The tools in the form chat templates take (OpenAI's, as Hugging Face passes them)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}} for t in fields.tools or []]


def _choice(choice: ToolChoice | None, names: tuple[str, ...]) -> str:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "none":
        return "none"
    if choice.type == "any":
        return "required"
    if choice.name is None:
        raise bad_request("tool_choice.name is required when tool_choice.type is 'tool'", "tool_choice.name")
    if choice.name not in names:
        raise bad_request(f"tool_choice names the tool {choice.name!r}, which is not among the tools "
                          f"({', '.join(names)})", "tool_choice.name")
    return choice.name


def check_tools(fields: MessagesRequest) -> None:
    """400 unless the tools are client tools and the tool choice has tools to choose from. Every template
    renders tools, calls and results: one that spells no call gets the generic form (core/constraints/generic.py)."""
    if not fields.tools and fields.tool_choice is not None and fields.tool_choice.type in ("any", "tool"):
        raise bad_request(f"tool_choice {fields.tool_choice.type!r} needs tools", "tool_choice")
    for i, t in enumerate(fields.tools or []):
        if t.type not in (None, "custom"):
            raise bad_request(f"tools[{i}].type {t.type!r}: Anthropic's server tools are not served here; give "
                              "client tools ({\"name\", \"description\", \"input_schema\"})", f"tools[{i}].type",
                              "unsupported_parameter")


def tool_request(fields: MessagesRequest, messages: list[dict], model) -> ToolRequest | None:
    """The request's tools as the core's ToolRequest (None without tools): the grammar of the calls
    `tool_choice` allows, in the model's call form."""
    check_tools(fields)
    if not fields.tools:
        return None
    names = tuple(t.name for t in fields.tools)
    specs = [ToolSpec(t.name, t.input_schema, f"tools[{i}].name", f"tools[{i}].input_schema")
             for i, t in enumerate(fields.tools)]
    parallel = not (fields.tool_choice is not None and fields.tool_choice.disable_parallel_tool_use)
    return core_tool_request(model, template_tools(fields), specs, _choice(fields.tool_choice, names), parallel)
