"""Ollama's /api/chat and /api/generate as declarations (CHAT, GENERATE: shared/builder.py's Api).

A chat's messages become the chat the templates take (OpenAI's form): an assistant's `tool_calls`
(arguments an object) become calls with ids, a `tool` message answers the earliest call of its
`tool_name` not yet answered, `thinking` is the reasoning templates render; a last assistant message is
continued, as Ollama continues it. /api/generate renders `system` and `prompt` with the model's template,
or with `raw` runs the prompt as it is; with `suffix` it is the fill-in-the-middle prompt. The tools
are Ollama's (OpenAI's form) through the core's tools grammar. `model` must name the served model (404
otherwise, as Ollama answers a model it has not pulled); `options.num_ctx` may not exceed the server's
context. Every refusal is a 400 naming the field.
"""
from __future__ import annotations

import json

from ...core.constraints.tools import NAME, ToolRequest, ToolSpec, tool_request
from ...core.assistant_prefill import prefilled
from ...core.request import GenRequest
from ...http.errors import ApiError, bad_request
from ..shared.builder import Api, Prompt, ServerView
from ..shared.fim_prompts import openai_fim_prompt
from ..shared.validation import parse
from .protocol import TEXT_ONLY, ChatRequest, GenerateRequest, Message, OllamaFields, Tool

_ROLES = ("system", "user", "assistant", "tool")


def served_names(server: ServerView) -> set[str]:
    """The names a request may give as `model`: the served model's, its aliases and profiles."""
    return {server.model_name, *server.aliases, *server.profiles}


def model_known(name: str, names: set[str]) -> bool:
    """Whether `name` (with or without Ollama's default tag `:latest`) is one of `names`."""
    return name in names or name.removesuffix(":latest") in names


def not_found(name: str) -> ApiError:
    return ApiError(404, f"model '{name}' not found: this server serves the model it was started with "
                         "(GET /api/tags lists its names)", "model")


def check(fields: OllamaFields, req: GenRequest, server: ServerView) -> None:
    """404 for a model this server does not serve; 400 for a num_ctx past the server's context."""
    if not model_known(fields.model, served_names(server)):
        raise not_found(fields.model)
    if fields.num_ctx is not None and fields.num_ctx > server.n_ctx:
        raise bad_request(f"options.num_ctx={fields.num_ctx} exceeds this server's context of {server.n_ctx} "
                          "tokens, which is set when it starts (-c)", "options.num_ctx")


def chat_messages(messages: list | None) -> list[dict]:
    """Ollama's messages in OpenAI's chat form. 400 naming the field for what cannot be rendered."""
    if not messages:
        raise bad_request("messages must be a non-empty array", "messages")
    out, pending, n_calls = [], [], 0  # pending: (id, name) of the calls not yet answered
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        m = parse(Message, raw, where)
        if m.role not in _ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}, got {m.role!r}", f"{where}.role")
        if m.images:
            raise bad_request(f"{where}.images: {TEXT_ONLY}", f"{where}.images", "unsupported_parameter")
        msg: dict = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            if m.role != "assistant":
                raise bad_request(f"{where}.tool_calls: only assistant messages carry tool calls",
                                  f"{where}.tool_calls")
            msg["tool_calls"] = []
            for call in m.tool_calls:
                args = call.function.arguments
                n_calls += 1
                msg["tool_calls"].append({"id": f"call_{n_calls}", "type": "function", "function": {
                    "name": call.function.name,
                    "arguments": args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)}})
                pending.append((f"call_{n_calls}", call.function.name))
        if m.thinking and m.role == "assistant":
            msg["reasoning_content"] = m.thinking
        if m.role == "tool":
            match = next((p for p in pending if m.tool_name in (None, p[1])), None)
            if match is not None:
                pending.remove(match)
            msg["tool_call_id"] = match[0] if match else f"call_{i}"
            if m.tool_name:
                msg["name"] = m.tool_name
        out.append(msg)
    return out


def chat_tools(fields: ChatRequest, messages: list[dict], model) -> ToolRequest | None:
    """Ollama's tools (OpenAI's form) as the core's ToolRequest; None without tools. Ollama has no
    tool_choice: the model may call or answer. One call a turn, as llama-server's default: small models
    given room for more go on calling until the limit, and Ollama's default limit is the context."""
    if not fields.tools:
        return None
    tools = []
    for i, raw in enumerate(fields.tools):
        t = parse(Tool, raw, f"tools[{i}]")
        if t.type != "function":
            raise bad_request(f"tools[{i}].type must be \"function\"", f"tools[{i}].type")
        if not NAME.match(t.function.name):
            raise bad_request(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -",
                              f"tools[{i}].function.name")
        tools.append(t)
    specs = [ToolSpec(t.function.name, t.function.parameters, f"tools[{i}].function.name",
                      f"tools[{i}].function.parameters") for i, t in enumerate(tools)]
    template = [{"type": "function", "function": {
        "name": t.function.name, "description": t.function.description or "",
        "parameters": t.function.parameters or {"type": "object", "properties": {}}}} for t in tools]
    return tool_request(model, template, specs, "auto", False)


async def chat_prompt(fields: ChatRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    chat = chat_messages(fields.messages)
    return Prompt(messages=chat, continue_final=prefilled(chat, None, None))


def chat_request_tools(fields: ChatRequest, body: dict, prompt: Prompt, target) -> ToolRequest | None:
    return chat_tools(fields, prompt.messages, target)


CHAT = Api("ollama_chat", ChatRequest, chat_prompt, limits=("num_predict",), random_seed=-1,
           tools=chat_request_tools, check=check)


async def generate_prompt(fields: GenerateRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The prompt with the template (system, then the prompt as the user's), raw, or with `suffix` the
    FIM prompt (healed unless `format` constrains the answer)."""
    if fields.images:
        raise bad_request(f"images: {TEXT_ONLY}", "images", "unsupported_parameter")
    if fields.template:
        raise bad_request("template is not supported: this server renders the model's own chat template "
                          "(send raw: true with a prompt laid out as you want it)", "template", "unsupported_parameter")
    if fields.context:
        raise bad_request("context is not supported: send the conversation to /api/chat, or the whole prompt",
                          "context", "unsupported_parameter")
    if not fields.prompt:
        raise bad_request("prompt is required", "prompt")
    if fields.suffix:
        tokens, heal = await openai_fim_prompt(server, fields.prompt, fields.suffix, max_tokens,
                                               heal=not fields.format)
        return Prompt(prompt=tokens, heal=heal)
    if fields.raw:
        if fields.system:
            raise bad_request("system is rendered by the model's template, which raw skips: put it in the prompt",
                              "system")
        return Prompt(prompt=fields.prompt)
    chat = [{"role": "system", "content": fields.system}] if fields.system else []
    return Prompt(messages=[*chat, {"role": "user", "content": fields.prompt}])


GENERATE = Api("ollama_generate", GenerateRequest, generate_prompt, limits=("num_predict",), random_seed=-1,
               handles=("suffix",), check=check)
