"""OpenAI's POST /v1/chat/completions: messages (text content parts), tools, the shared fields.

The body is checked by `ChatRequest`, turned into the one GenRequest, and the answer's events
(core/answer.py) are shaped as OpenAI's chat.completion, or chat.completion.chunk deltas with
`tool_calls` as the calls are read back. A reasoning model's block comes as `reasoning_content`
(DeepSeek's and llama-server's field), whole and in deltas; `reasoning_format` and the budget
(`reasoning_budget`, llama-server's; `thinking_budget_tokens`, Continue's) are per request.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ....chat import MessageError, validate_messages
from ...core.answer import events
from ...core.constraints.tools import ToolRequest, call_form
from ...core.events import CallStart, Event, Finish, Reasoning, Text
from ...core.jobs import Job, start
from ...core.prefill import prefill_joined, prefilled
from ...core.reasoning import FORMATS
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...http.guard import key_scope
from ..shared import several
from ..shared.answer import stream, traced
from ..shared.builder import Api, Prompt, ServerView, build_request
from ..shared.fields import template_kwargs_of
from ..shared.probs import count, llama_probs
from ..shared.progress import progress_events
from ..shared.timings import timings
from .common import OpenAIGeneration, head, respond, stream_end, verbose
from .tools import Tool, openai_tools

_CONTENT_PARTS = ("text",)  # chat content part types understood; images, audio and files are not


class ChatRequest(OpenAIGeneration):
    messages: list | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    n_predict: int | None = None  # llama-server's name (-1: no limit; 0: only put the prompt in a slot's cache)
    tools: list[Tool] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", ...}: tools.py
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool | None = None  # llama-server's and vLLM's
    continue_final_message: bool | None = None  # the last (assistant) message is continued (core/prefill.py)
    chat_template_kwargs: dict | None = None  # more variables for the chat template (llama-server's, vLLM's)
    reasoning_format: str | None = None  # llama-server's: "none", "deepseek", "auto" (core/reasoning.py)
    reasoning_budget: int | None = None  # llama-server's: -1 unlimited, 0 no reasoning, n tokens
    thinking_budget_tokens: int | None = None  # Continue's name for it
    logprobs: bool | None = None  # each answer token's logprob (shared/probs.py: llama-server's objects, OpenAI's)
    top_logprobs: int | None = None  # and this many alternatives at each
    post_sampling_probs: bool | None = None  # llama-server's: probabilities of the distribution sampled from

    def logprobs_asked(self) -> tuple[int, str] | None:
        """(alternatives, logprobs_mode) where logprobs are asked for; 400 for top_logprobs without them."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
            return None
        return count(self.top_logprobs or 0, "top_logprobs"), "processed" if self.post_sampling_probs else "raw"

    def reasoning_asked(self) -> tuple[str | None, int | None]:
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
    return [Endpoint(path, chat_completions) for path in ("/v1/chat/completions", "/chat/completions")]


def prepare(target) -> None:
    """At start-up: say which tool-call form the model's chat template gets (core/constraints/tools.py)."""
    logging.getLogger("specserve.server").info("tool calls: %s", call_form(target).describe())


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
    """The chat, its last message continued where it is the assistant's (core/prefill.py)."""
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
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, fields = await build_request(CHAT, body, ServerView.of(state, key_scope(request.scope)))
    n = several.count(fields.n, len(state.scheduler.pool.slots), stream=req.stream)
    if req.stream:
        job = await start(state, req, request)
        return stream(request, job, _chunks(job, head("chat.completion.chunk", req), fields))
    outs = await several.answers(state, several.variants(req, n), request)
    if outs is None:
        return respond([], None)
    jobs = [job for job, _ in outs]
    choices = [(job, out) for job, out in outs for _ in range(n // len(outs))]  # greedy: one answer, n times
    return respond(jobs, {**head("chat.completion", req), "choices": [traced({
        "index": i, "message": out.message, "logprobs": _logprobs(state, fields, out.logprobs),
        "finish_reason": out.reason, **out.detail}, out.trace)
        for i, (_, out) in enumerate(choices)], **verbose(state, fields, *outs[0])})


def _logprobs(state, fields: ChatRequest, rows) -> dict | None:
    """A choice's `logprobs` (null unless asked): llama-server's objects, which carry OpenAI's fields."""
    if rows is None:
        return None
    return {"content": llama_probs(state.engine.target, rows, bool(fields.post_sampling_probs))}


async def _chunks(job: Job, head: dict, fields):
    """The stream: the role, then a chunk per event, the finish, usage and [DONE]."""

    state, pending = job.state, [] if job.logprobs is not None else None  # logprobs not yet sent

    def choice(delta: dict, finish: str | None = None, detail: dict | None = None) -> dict:
        rows = None
        if pending is not None and delta.get("role") is None:
            rows = list(pending)
            pending.clear()
        c = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": _logprobs(state, fields, rows),
                                  "finish_reason": finish, **(detail or {})}]}
        return {**c, "timings": timings(job)} if fields.timings_per_token and delta.get("role") is None else c

    if fields.return_progress:
        for progress, times in progress_events(job):
            yield {**choice({"role": "assistant", "content": None}), "prompt_progress": progress,
                   **({"timings": times} if fields.timings_per_token else {})}
    else:
        yield choice({"role": "assistant", "content": None})  # llama-server's: no text yet
    async for event in events(job):
        if pending is not None and type(event) in (Text, Reasoning) and event.logprobs:
            pending.extend(event.logprobs)  # sent with the next chunk (a token's text may come later)
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
    async for chunk in stream_end(head, last, job, fields.include_usage):
        yield chunk
