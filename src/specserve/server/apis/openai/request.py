"""OpenAI's generating APIs as declarations (shared/builder.py's Api): chat completions (CHAT: the messages,
a last assistant message continued, the tools), completions (COMPLETIONS: a prompt, or with `suffix` the
FIM layout) and Responses (RESPONSES: `input` and `instructions` as the chat the templates take, its
function tools). The server keeps no responses: `store` is accepted and nothing is stored,
`previous_response_id` and item references are refused (400) with what to send instead.
"""
from __future__ import annotations

import json
import logging

from ....chat import MessageError, validate_messages
from ...core.constraints.tools import ToolRequest, ToolSpec, tool_request
from ...core.params import TokenLimit
from ...core.assistant_prefill import prefill_joined, prefilled
from ...http.errors import bad_request
from ..shared.builder import Api, Prompt, ServerView
from ..shared.generation_fields import prompt_value, required, template_kwargs_of
from ..shared.fim_prompts import openai_fim_prompt
from ..shared.validation import parse
from .protocol import (
    ChatRequest,
    CompletionRequest,
    FunctionCallItem,
    FunctionOutputItem,
    FunctionTool,
    MessageItem,
    ResponsesRequest,
)
from .tools import openai_tools

log = logging.getLogger("specserve.server")
STATELESS = ("this server keeps no responses (store is accepted, nothing is stored): send the whole conversation "
             "in `input`, the earlier output items included")
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = {"input_text", "output_text", "text"}

_CONTENT_PARTS = ("text",)  # chat content part types understood; images, audio and files are not


def check_content_parts(messages: list) -> None:
    """400 `unsupported_parameter` for a chat content part that is not text (an image would be dropped)."""
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _CONTENT_PARTS:
                raise bad_request(f"content parts of type {json.dumps(kind)[:40]} are not supported: this server "
                                  "reads text only", f"messages[{i}].content[{j}]", "unsupported_parameter")


def check_messages(messages: list) -> None:
    """400 naming the field for what OpenAI refuses too: a role that is not one of OpenAI's,
    missing content, non-text content parts, malformed tool calls."""
    check_content_parts(messages)
    try:
        validate_messages(messages)
    except MessageError as e:
        raise bad_request(str(e), e.param, e.code) from None


async def chat_prompt(fields: ChatRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The chat, its last message continued where it is the assistant's (core/assistant_prefill.py)."""
    if not fields.messages:
        raise bad_request("messages must be a non-empty array", "messages")
    check_messages(fields.messages)
    cont = prefilled(validate_messages(fields.messages), fields.add_generation_prompt, fields.continue_final_message)
    return Prompt(messages=prefill_joined(fields.messages, cont), continue_final=cont,
                  template_kwargs=template_kwargs_of(fields.chat_template_kwargs, {}) or None)


def chat_tools(fields: ChatRequest, body: dict, prompt: Prompt, target) -> ToolRequest | None:
    return openai_tools(body.get("tools"), fields.tools, fields.tool_choice, fields.parallel_tool_calls,
                        fields.messages, target)


CHAT = Api("chat", ChatRequest, chat_prompt, limits=("max_completion_tokens", "max_tokens", "n_predict"),
           handles=("n", "logprobs", "top_logprobs", "post_sampling_probs"), warms=True, tools=chat_tools)


DEFAULT_MAX_TOKENS = TokenLimit("max_tokens", 16)  # /v1/completions without max_tokens: OpenAI's default


async def completion_prompt(fields: CompletionRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The prompt; with `suffix`, the FIM prompt /infill would lay out, healed unless a grammar constrains
    the answer instead."""
    prompt = required(prompt_value(fields.prompt), "prompt")
    if fields.echo and fields.suffix:
        raise bad_request("echo and suffix cannot be used together", "echo")
    if not fields.suffix:
        return Prompt(prompt=prompt)
    tokens, heal = await openai_fim_prompt(server, prompt, fields.suffix, max_tokens, heal=not fields.requested())
    return Prompt(prompt=tokens, heal=heal)


COMPLETIONS = Api("completions", CompletionRequest, completion_prompt, limits=("max_tokens",),
                  default_limit=DEFAULT_MAX_TOKENS, handles=("suffix", "n", "echo", "logprobs"))


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


def _reasoning_text(content, where: str) -> str:
    """A reasoning item's `content` (absent, or an array of reasoning_text parts) as text; 400 naming the part
    for anything else (its summary and encrypted_content are not read)."""
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad_request(f"{where} must be an array of reasoning_text parts", where)
    texts = []
    for k, part in enumerate(content):
        text = part.get("text") if isinstance(part, dict) else None
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
            text = _reasoning_text(raw.get("content"), f"{where}.content")
            if text:
                prev = _assistant(out)
                prev["reasoning_content"] = prev.get("reasoning_content", "") + text
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


async def responses_prompt(fields: ResponsesRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    check_stateless(fields)
    return Prompt(messages=chat_messages(fields))


def responses_tools(fields: ResponsesRequest, body: dict, prompt: Prompt, target) -> ToolRequest | None:
    return tools_of(fields, prompt.messages, target)


RESPONSES = Api("responses", ResponsesRequest, responses_prompt, limits=("max_output_tokens",),
                tools=responses_tools)
