"""Anthropic's Messages API as a declaration (MESSAGES: shared/builder.py's Api), and its body as the chat
the templates take.

`chat_messages` turns system and messages (protocol.py) into OpenAI's chat form, which
`GenRequest.messages` holds and chat templates render; a last assistant message is continued (core's
prefill rule, as Anthropic's prefill). `tool_request` reads the tools into the core's ToolRequest.
Every refusal is a 400 naming the field by its path (`messages[2].content[0].tool_use_id`).
"""
from __future__ import annotations

import json
import re

from ...core.constraints.tools import ToolRequest, ToolSpec
from ...core.constraints.tools import tool_request as core_tool_request
from ...core.assistant_prefill import prefilled
from ...http.errors import bad_request
from ..shared.builder import Api, Prompt, ServerView
from ..shared.validation import parse
from .protocol import Message, MessagesRequest, TextBlock, ThinkingBlock, ToolChoice, ToolResultBlock, ToolUseBlock

# Claude Code's first system block carries a per-request stamp (`cch=ab12f;`) that would end every
# prompt's cached prefix there; it means nothing to a local model, so it is fixed (as llama-server does).
_BILLING_STAMP = re.compile(r"^(x-anthropic-billing-header:[^\n]*?cch=)[0-9a-zA-Z]+;")


# which role may send which block, and its model; redacted_thinking is accepted and dropped (its
# text is encrypted by Anthropic for Anthropic's models: nothing a local model can read)
_BLOCKS = {"text": (TextBlock, ("user", "assistant")), "tool_use": (ToolUseBlock, ("assistant",)),
           "tool_result": (ToolResultBlock, ("user",)), "thinking": (ThinkingBlock, ("assistant",)),
           "redacted_thinking": (None, ("assistant",))}


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


async def messages_prompt(fields: MessagesRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The chat; a last message from the assistant is continued, as Anthropic continues it (prefill: the
    answer begins where that text stops, and holds only what follows it)."""
    chat = chat_messages(fields)
    return Prompt(messages=chat, continue_final=prefilled(chat, None, None))


def messages_tools(fields: MessagesRequest, body: dict, prompt: Prompt, target) -> ToolRequest | None:
    return tool_request(fields, prompt.messages, target)


MESSAGES = Api("messages", MessagesRequest, messages_prompt, limits=("max_tokens",), limit_required=True,
               tools=messages_tools)
