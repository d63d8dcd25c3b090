"""Ollama's POST /api/chat and /api/generate, for Ollama's clients (Open WebUI, Continue, the `ollama`
Python client, langchain-ollama): the same speculative decoding as every other API.

The body (protocol.py; request.py's declarations, which shared/builder.py runs) becomes the one
GenRequest. The answer is Ollama's: one JSON object, or with `stream` (Ollama's default) JSON lines
(`application/x-ndjson`), each `{"model", "created_at", "message" | "response", "done": false}`, then
one with `done: true`, `done_reason` ("stop" or "length"), the counts and durations in nanoseconds
(`total_duration`, `load_duration`: 0, the model is loaded when the server starts; `prompt_eval_count`:
the prompt's tokens, those read from the slot's cache among them; `prompt_eval_duration`, `eval_count`,
`eval_duration`) and `speculative`: what speculation did, as every API's usage carries it. ReasoningText
comes as `thinking`; a chat's tool calls as `message.tool_calls[].function.{name, arguments}` with the
arguments an object, in a line of their own once each call is whole. A request without messages or prompt
is Ollama's load request: answered at once (`done_reason: "load"`), the model being always loaded.
Every refusal is Ollama's `{"error": "..."}` with its status; one after the first line is a last line.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.answer import answer, events, speculative_usage
from ...core.constraints.toolcalls import Call
from ...core.events import CallArguments, CallStart, Finish, ReasoningText, Text
from ...core.jobs import CLIENT_GONE, Job, start
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import ApiError
from ...http.guard import key_scope
from ...http.sse import sse_response
from ...state import server_of
from ..shared.builder import Api, ServerView, build_request
from ..shared.validation import parse
from .request import CHAT, GENERATE, model_known, not_found, served_names


def error_body(err: ApiError) -> dict:
    """Ollama's error shape, which its clients raise as ResponseError(error, status)."""
    return {"error": err.message}


def routes() -> list[Endpoint]:
    return [Endpoint("/api/chat", chat, render_error=error_body),
            Endpoint("/api/generate", generate, render_error=error_body)]


def created_at() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def done_reason(reason: str) -> str:
    """Ollama's done_reason: "length" where the limit ended the answer, else "stop" (tool calls too)."""
    return "length" if reason == "length" else "stop"


def durations(job: Job, t0: int) -> dict:
    """Ollama's counts and durations (nanoseconds) of the request that began at perf_counter_ns t0."""
    s = job.stats
    return {"total_duration": time.perf_counter_ns() - t0, "load_duration": 0,
            "prompt_eval_count": s.n_prompt, "prompt_eval_duration": int(s.t_prompt * 1e9),
            "eval_count": s.n_generated, "eval_duration": int(max(0.0, s.t_total - s.t_prompt) * 1e9)}


def tool_call(index: int, name: str, arguments: str) -> dict:
    """A call in Ollama's shape: its arguments an object (`{}` where they are not one)."""
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        args = {}
    return {"function": {"index": index, "name": name, "arguments": args if isinstance(args, dict) else {}}}


def _calls(calls: list[Call]) -> list[dict]:
    return [tool_call(i, c.name, c.arguments) for i, c in enumerate(calls)]


async def _generating(request: Request, api: Api, text_key: str) -> Response:
    t0 = time.perf_counter_ns()
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    server = ServerView.of(state, key_scope(request.scope))
    chat = api is CHAT
    if isinstance(body, dict) and not body.get("messages" if chat else "prompt") and not body.get("suffix"):
        return _loaded(api, body, server, chat)
    req, fields = await build_request(api, body, server)
    job = await start(state, req, request)
    head = {"model": fields.model}
    if req.stream:
        return sse_response(_lines(job, head, chat, t0), job, state.metrics.error,
                            f"{request.method} {request.url.path}", error_body, line, "application/x-ndjson")
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    piece: dict
    if chat:
        message = {"role": "assistant", "content": out.content}
        if out.reasoning:
            message["thinking"] = out.reasoning
        if out.calls:
            message["tool_calls"] = _calls(out.calls)
        piece = {"message": message}
    else:
        piece = {text_key: out.content, **({"thinking": out.reasoning} if out.reasoning else {})}
    answer_body = {**head, "created_at": created_at(), **piece, "done": True, "done_reason": done_reason(out.reason),
                   **durations(job, t0), "speculative": speculative_usage(job), **out.detail}
    if out.trace is not None:
        answer_body["speculative_trace"] = out.trace
    return JSONResponse(answer_body)


def _loaded(api: Api, body: dict, server: ServerView, chat: bool) -> Response:
    """Ollama's load request (no messages, no prompt): the model is loaded for the server's life, so it is
    answered at once, done. keep_alive 0 (Ollama's unload) unloads nothing here: single-model mode."""
    fields = parse(api.fields, body)
    if not model_known(fields.model, served_names(server)):
        raise not_found(fields.model)
    piece = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({"model": fields.model, "created_at": created_at(), **piece, "done": True,
                         "done_reason": "load"})


async def chat(request: Request) -> Response:
    return await _generating(request, CHAT, "message")


async def generate(request: Request) -> Response:
    return await _generating(request, GENERATE, "response")


async def _lines(job: Job, head: dict, chat: bool, t0: int) -> AsyncIterator[dict]:
    """The stream's lines: a piece of text or thinking each, a chat's tool call once whole, then the end."""
    call: list | None = None  # [index, name, arguments so far] of the call being read
    n_calls = 0

    def piece(text: str = "", thinking: str | None = None, calls: list | None = None) -> dict:
        extra = {"thinking": thinking} if thinking is not None else {}
        if chat:
            message = {"role": "assistant", "content": text, **extra, **({"tool_calls": calls} if calls else {})}
            return {**head, "created_at": created_at(), "message": message}
        return {**head, "created_at": created_at(), "response": text, **extra}

    async for event in events(job):
        kind = type(event)
        if kind in (Text, ReasoningText):
            if event.text:
                out = piece(event.text) if kind is Text else piece(thinking=event.text)
                if event.trace is not None:
                    out["speculative_trace"] = event.trace
                yield {**out, "done": False}
            continue
        if call is not None and kind in (CallStart, Finish):
            yield {**piece(calls=[tool_call(*call)]), "done": False}
            call = None
        if kind is CallStart:
            call, n_calls = [n_calls, event.name, ""], n_calls + 1
        elif kind is CallArguments:
            call[2] += event.text
        elif kind is Finish:
            yield {**piece(), "done": True, "done_reason": done_reason(event.reason), **durations(job, t0),
                   "speculative": speculative_usage(job), **event.detail}
