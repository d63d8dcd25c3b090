"""OpenAI's POST /v1/chat/completions: messages (text content parts), tools, the shared fields.

The body is checked by `ChatRequest`, turned into the one GenRequest, and the answer's events
(core/answer.py) are shaped as OpenAI's chat.completion, or chat.completion.chunk deltas with
`tool_calls` as the calls are read back. A reasoning model's block comes as `reasoning_content`
(DeepSeek's and llama-server's field), whole and in deltas; `reasoning_format` and the budget
(`reasoning_budget`, llama-server's; `thinking_budget_tokens`, Continue's) are per request.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...chat import MessageError, validate_messages
from ..core.answer import answer, events
from ..core.events import CallStart, Event, Finish, Reasoning, Text
from ..core.jobs import Job, start
from ..core.reasoning import FORMATS
from ..core.request import GenRequest
from ..http.body import read_json
from ..http.endpoint import Endpoint
from ..http.errors import bad_request
from .constraint_fields import output_grammar
from .fields import check_unsupported, first_limit, params_of, resolve_profile
from .openai_common import OpenAIGeneration, head, key_scope, respond, stream, stream_end, traced
from .openai_tools import Tool, openai_tools
from .validation import parse

_CONTENT_PARTS = ("text",)  # chat content part types understood; images, audio and files are not


class ChatRequest(OpenAIGeneration):
    messages: list | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", ...}: openai_tools.py
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None  # llama-server's: "none", "deepseek", "auto" (core/reasoning.py)
    reasoning_budget: int | None = None  # llama-server's: -1 unlimited, 0 no reasoning, n tokens
    thinking_budget_tokens: int | None = None  # Continue's name for it

    def reasoning(self) -> tuple[str | None, int | None]:
        """(reasoning_format, budget) asked for, or 400 naming the field."""
        if self.reasoning_format is not None and self.reasoning_format not in FORMATS:
            raise bad_request(f"reasoning_format must be one of {', '.join(FORMATS)}, got "
                              f"{self.reasoning_format[:40]!r}", "reasoning_format", "invalid_value")
        budgets = [(k, v) for k, v in (("reasoning_budget", self.reasoning_budget),
                                       ("thinking_budget_tokens", self.thinking_budget_tokens)) if v is not None]
        for key, v in budgets:
            if v < -1:
                raise bad_request(f"{key} must be -1 (unlimited), 0 (no reasoning) or a number of tokens, got {v}",
                                  key, "invalid_value")
        if len(budgets) == 2 and budgets[0][1] != budgets[1][1]:
            raise bad_request("reasoning_budget and thinking_budget_tokens differ: give one of them",
                              "thinking_budget_tokens", "conflicting_parameters")
        return self.reasoning_format, budgets[0][1] if budgets else None


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/chat/completions", chat_completions)]


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


async def chat_request(request: Request) -> tuple[GenRequest, ChatRequest]:
    """The body as a GenRequest (and its fields, for what shapes the answer)."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    fields = parse(ChatRequest, body)
    profile = resolve_profile(fields.model, state.profiles, state.settings.model_name)
    check_unsupported(body)
    sampling, limit, spec, verify = params_of(state, fields, profile, key_scope(request),
                                              first_limit(fields, ("max_completion_tokens", "max_tokens")))
    if not fields.messages:
        raise bad_request("messages must be a non-empty array", "messages")
    check_messages(fields.messages)
    tools = openai_tools(body.get("tools"), fields.tools, fields.tool_choice, fields.parallel_tool_calls,
                         fields.messages, state.engine.target)
    grammar = await output_grammar(state, fields, tools)
    if grammar is not None:
        sampling = dataclasses.replace(sampling, grammar=grammar)
    reasoning_format, reasoning_budget = fields.reasoning()
    req = GenRequest("chat", profile.name, sampling, spec, verify, stream=bool(fields.stream),
                     messages=fields.messages, cache_prompt=fields.cache_prompt is not False, limit=limit,
                     tools=tools, reasoning_format=reasoning_format, reasoning_budget=reasoning_budget)
    return req, fields


def delta(event: Event) -> dict:
    """A Text, Reasoning or tool-call event as the `delta` of an OpenAI chat.completion.chunk."""
    if type(event) is Text:
        return {"content": event.text}
    if type(event) is Reasoning:
        return {"reasoning_content": event.text}
    if type(event) is CallStart:
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


async def chat_completions(request: Request) -> Response:
    req, fields = await chat_request(request)
    job = await start(request.app.state.server, req, request)
    if req.stream:
        return stream(request, job, _chunks(job, head("chat.completion.chunk", req), fields.include_usage))
    out = await answer(job, request)
    return respond(job, None if out is None else {**head("chat.completion", req), "choices": [traced({
        "index": 0, "message": out.message, "logprobs": None, "finish_reason": out.reason, **out.detail},
        out.trace)]})


async def _chunks(job: Job, head: dict, include_usage: bool):
    """The stream: the role, then a chunk per event, the finish, usage and [DONE]."""

    def choice(delta: dict, finish: str | None = None, detail: dict | None = None) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                     **(detail or {})}]}

    yield choice({"role": "assistant", "content": ""})
    async for event in events(job):
        if type(event) in (Text, Reasoning):
            if event.text:
                c = choice(delta(event))
                if event.trace is not None:
                    c["choices"][0]["speculative_trace"] = event.trace
                yield c
        elif type(event) is Finish:
            last = choice({}, event.reason, event.detail)
        else:
            yield choice(delta(event))
    async for chunk in stream_end(head, last, job, include_usage):
        yield chunk
