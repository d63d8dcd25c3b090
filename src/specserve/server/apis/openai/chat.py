"""OpenAI's POST /v1/chat/completions: messages (text content parts), tools, the shared fields.

The body is checked by `ChatRequest` (protocol.py), turned into the one GenRequest (request.CHAT), and the
answer's events
(core/answer.py) are shaped as OpenAI's chat.completion, or chat.completion.chunk deltas with
`tool_calls` as the calls are read back. A reasoning model's block comes as `reasoning_content`
(DeepSeek's and llama-server's field), whole and in deltas; `reasoning_format` and the budget
(`reasoning_budget`, llama-server's; `thinking_budget_tokens`, Continue's) are per request.
"""
from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from ...core.answer import events
from ...core.constraints.tools import call_form
from ...core.events import CallStart, Event, Finish, ReasoningText, Text
from ...core.jobs import Job, start
from ...core.server_parts import ServerParts
from ...http.endpoint import Endpoint
from ..shared import n_completions
from ..shared.answer import stream, traced
from ..shared.builder import request_of
from ..shared.logprob_shapes import llama_probs
from ..shared.prompt_progress import progress_events
from ..shared.timings import timings
from .common import head, respond, stream_end, verbose
from .protocol import ChatRequest
from .request import CHAT


def routes() -> list[Endpoint]:
    return [Endpoint(path, chat_completions) for path in ("/v1/chat/completions", "/chat/completions")]


def prepare(target) -> None:
    """At start-up: say which tool-call form the model's chat template gets (core/constraints/tools.py)."""
    logging.getLogger("specserve.server").info("tool calls: %s", call_form(target).describe())


def delta(event: Event) -> dict:
    """A Text, ReasoningText or tool-call event as the `delta` of an OpenAI chat.completion.chunk."""
    if type(event) is Text:
        return {"content": event.text}
    if type(event) is ReasoningText:
        return {"reasoning_content": event.text}
    if type(event) is CallStart:
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}


async def chat_completions(request: Request) -> Response:
    state, req, fields = await request_of(CHAT, request)
    n = n_completions.count(fields.n, state.n_slots, stream=req.stream)
    if req.stream:
        job = await start(state, req, request)
        return stream(request, job, _chunks(job, head("chat.completion.chunk", req), fields))
    outs = await n_completions.answers(state, n_completions.variants(req, n), request)
    if outs is None:
        return respond([], None)
    jobs = [job for job, _ in outs]
    choices = [(job, out) for job, out in outs for _ in range(n // len(outs))]  # greedy: one answer, n times
    return respond(jobs, {**head("chat.completion", req), "choices": [traced({
        "index": i, "message": out.message, "logprobs": _logprobs(state, fields, out.logprobs),
        "finish_reason": out.reason, **out.detail}, out.trace)
        for i, (_, out) in enumerate(choices)], **verbose(state, fields, *outs[0])})


def _logprobs(state: ServerParts, fields: ChatRequest, rows) -> dict | None:
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
        if pending is not None and type(event) in (Text, ReasoningText) and event.logprobs:
            pending.extend(event.logprobs)  # sent with the next chunk (a token's text may come later)
        if type(event) in (Text, ReasoningText):
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
