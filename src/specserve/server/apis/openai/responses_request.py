"""OpenAI's Responses request: its pydantic models, and `input` as the chat the templates take.

`ResponsesRequest` checks a /v1/responses body: `input` (a string, or items: messages, `function_call`,
`function_call_output`, `reasoning`), `instructions`, `tools` (function tools; the hosted ones are
left out, as llama-server does), `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `text.format`,
`reasoning.effort`, and the shared fields (sampling, `speculative`: fields.Generation). The server
keeps no responses: `store` is accepted and nothing is stored, `previous_response_id` and item
references are refused (400) with what to send instead.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Literal

from pydantic import Field

from ...core.constraints.structured import json_object, schema_grammar
from ...core.constraints.tools import NAME, ToolRequest, ToolSpec, tool_request
from ...http.errors import bad_request
from ..shared.fields import Generation
from ..shared.validation import Fields, StrictModel, parse

log = logging.getLogger("specserve.server")
STATELESS = ("this server keeps no responses (store is accepted, nothing is stored): send the whole conversation "
             "in `input`, the earlier output items included")
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = {"input_text", "output_text", "text"}


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: str = Field(pattern=NAME.pattern)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class TextFormat(Fields):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None


class TextConfig(Fields):
    format: TextFormat | None = None


class Reasoning(Fields):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class FunctionCallItem(Fields):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionOutputItem(Fields):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list


class MessageItem(Fields):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list
    type: Literal["message"] | None = None


class ResponsesRequest(Generation):
    input: str | list | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    metadata: dict | None = None  # echoed back, as OpenAI's API does
    timings_per_token: bool | None = None  # llama-server's: text deltas carry `timings`
    return_progress: bool | None = None  # llama-server's: response.in_progress events with `prompt_progress`

    def format_grammar(self) -> tuple[str, str] | None:
        """(param, grammar) of text.format, for constraint_fields.output_grammar (None: plain text)."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return "text.format", json_object(validate=False)
        if fmt.schema_ is None:
            raise bad_request("Missing required parameter: 'text.format.schema'", "text.format.schema",
                              "missing_required_parameter")
        return "text.format", schema_grammar(fmt.schema_, "text.format.schema")

    def reasoning_effort(self) -> str | None:
        return self.reasoning.effort if self.reasoning is not None else None

    def reasoning_budget(self) -> int | None:
        """The reasoning budget in tokens (GenRequest.reasoning_budget): 0 for effort "none" (the block
        closed at once), else None (the server's --reasoning-budget: an effort names no token count)."""
        return 0 if self.reasoning_effort() == "none" else None

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        return None, self.reasoning_budget()


def check_stateless(fields: ResponsesRequest) -> None:
    if fields.previous_response_id:
        raise bad_request(f"previous_response_id is not supported: {STATELESS}", "previous_response_id",
                          "unsupported_parameter")
    if fields.background:
        raise bad_request("background responses are not supported: this server answers while the request is open",
                          "background", "unsupported_parameter")


def _parts_text(content: str | list, where: str) -> str:
    """A message's content as text: a string, or its text parts joined (images and files refused)."""
    if isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise bad_request(f"{where}[{k}]: content of type {json.dumps(kind)[:40]} is not supported: this server "
                              "reads text only", f"{where}[{k}].type", "unsupported_parameter")
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}[{k}].text must be a string", f"{where}[{k}].text")
        texts.append(text)
    return "".join(texts)


def _assistant(out: list[dict]) -> dict:
    """The assistant message the next output item belongs to: the last message if it is the
    assistant's (a message, then its calls, are one turn), else a new one."""
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
    return out[-1]


def chat_messages(fields: ResponsesRequest) -> list[dict]:
    """instructions + input in OpenAI's chat form. 400 naming the field for what cannot be rendered."""
    out = [{"role": "system", "content": fields.instructions}] if fields.instructions else []
    if fields.input is None:
        raise bad_request("Missing required parameter: 'input'", "input", "missing_required_parameter")
    if isinstance(fields.input, str):
        return out + [{"role": "user", "content": fields.input}]
    if not fields.input:
        raise bad_request("input must be a string or a non-empty array of items", "input")
    for i, raw in enumerate(fields.input):
        where = f"input[{i}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind in (None, "message"):
            m = parse(MessageItem, raw, where)
            text = _parts_text(m.content, f"{where}.content")
            if m.role == "assistant":
                prev = _assistant(out)
                prev["content"] += text
            else:
                out.append({"role": m.role, "content": text})
        elif kind == "function_call":
            c = parse(FunctionCallItem, raw, where)
            try:
                json.loads(c.arguments)
            except ValueError:
                raise bad_request(f"{where}.arguments is not valid JSON", f"{where}.arguments",
                                  "invalid_value") from None
            _assistant(out).setdefault("tool_calls", []).append(
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
        elif kind == "function_call_output":
            o = parse(FunctionOutputItem, raw, where)
            out.append({"role": "tool", "tool_call_id": o.call_id, "content": _parts_text(o.output, f"{where}.output")})
        elif kind == "reasoning":  # its text, where given, is what reasoning templates render
            texts = [p.get("text", "") for p in raw.get("content") or [] if isinstance(p, dict)]
            if any(texts):
                prev = _assistant(out)
                prev["reasoning_content"] = prev.get("reasoning_content", "") + "".join(texts)
        elif kind == "item_reference":
            raise bad_request(f"{where}: item references are not supported: {STATELESS}", f"{where}.type",
                              "unsupported_parameter")
        else:
            raise bad_request(f"{where}: items of type {json.dumps(kind)[:40]} are not supported here (messages, "
                              "function_call, function_call_output and reasoning are)", f"{where}.type",
                              "unsupported_parameter")
    return out


def function_tools(fields: ResponsesRequest) -> list[tuple[int, FunctionTool]]:
    """The function tools with their index in `tools`; hosted tools (web_search, file_search, ...) have
    nothing here to run them and are left out, as llama-server leaves them out (an agent that declares
    them would otherwise get 400 on every request)."""
    found, skipped = [], []
    for i, raw in enumerate(fields.tools or []):
        if isinstance(raw, dict) and raw.get("type") == "function":
            found.append((i, parse(FunctionTool, raw, f"tools[{i}]")))
        else:
            skipped.append(raw.get("type") if isinstance(raw, dict) else None)
    if skipped:
        log.info("responses: tools of type %s left out (only function tools are served)", ", ".join(map(str, skipped)))
    return found


def _choice(value, names: tuple[str, ...]) -> str:
    if value is None or value == "auto":
        return "auto"
    if value in ("none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        if value["name"] not in names:
            raise bad_request(f"tool_choice names the function {value['name']!r}, which is not among the tools "
                              f"({', '.join(names)})", "tool_choice.name", "invalid_value")
        return value["name"]
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                      "tool_choice", "invalid_value")


def tools_of(fields: ResponsesRequest, messages: list[dict], model) -> ToolRequest | None:
    """The function tools as the core's ToolRequest (None without them). A conversation that holds
    tool calls needs a template that spells them."""
    tools = function_tools(fields)
    if not tools:
        if fields.tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs function tools", "tool_choice")
        return None
    names = tuple(t.name for _, t in tools)
    specs = [ToolSpec(t.name, t.parameters, f"tools[{i}].name", f"tools[{i}].parameters") for i, t in tools]
    template = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                  "parameters": t.parameters or {"type": "object", "properties": {}}}}
                for _, t in tools]
    parallel = fields.parallel_tool_calls is not False
    return tool_request(model, template, specs, _choice(fields.tool_choice, names), parallel)
