"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, for Claude-Code-style agents.

The body (protocol.py's model; request.py's declaration, which shared/builder.py runs) becomes the one
GenRequest: system and messages as a chat in the templates' form (a last assistant message is continued,
as Anthropic's prefill), tools through the core's tools grammar, `max_tokens`, `stop_sequences` and
sampling over the request's profile, the `speculative` object as on every API. The answer's events are
shaped as a `message` with content blocks (text, tool_use; thinking once the core parts reasoning out),
or streamed as Anthropic's named events (stream.py). `usage` counts the prompt tokens read from the
slot's cache as `cache_read_input_tokens` (Anthropic's input_tokens are the rest) and carries
`speculative`. Every refusal on these paths has Anthropic's error body. `x-api-key` is read by the
key guard (http/guard.py); `anthropic-version` and `anthropic-beta` are accepted and not needed.
"""
from __future__ import annotations

import json
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.answer import Answer, answer
from ...core.jobs import CLIENT_GONE, start
from ...core.assistant_prefill import prefilled
from ...core.request import GenRequest
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import ApiError
from ...http.sse import sse_response
from ...state import server_of
from ..shared.builder import request_of
from ..shared.generation_fields import count_chat_tokens
from ..shared.validation import parse
from . import stream as anthropic_stream
from .protocol import MessagesRequest
from .request import MESSAGES, chat_messages, tool_request
from .stream import stop_reason, usage

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 529: "overloaded_error"}


def error_body(err: ApiError) -> dict:
    """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/messages", messages, render_error=error_body),
            Endpoint("/v1/messages/count_tokens", count_tokens, render_error=error_body)]


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def head(req: GenRequest, fields: MessagesRequest) -> dict:
    return {"id": message_id(), "type": "message", "role": "assistant", "model": fields.model or req.model}


def content_blocks(out: Answer) -> list[dict]:
    """The whole answer's content blocks: its reasoning as a thinking block (signed "": nothing here signs),
    text (omitted when blank beside tool calls), then each call's tool_use with its arguments as an object;
    a call max_tokens cut short comes last, as Anthropic's API gives it (stop_reason max_tokens with an
    incomplete tool_use block: its input as far as it is a whole object, else empty)."""
    blocks = [{"type": "thinking", "thinking": out.reasoning, "signature": ""}] if out.reasoning else []
    cut = out.cut_by_limit
    if out.content and (out.content.strip() or not (out.calls or cut)):
        blocks.append({"type": "text", "text": out.content})
    for call in [*out.calls, *([cut] if cut else [])]:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:  # cut short
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": arguments if isinstance(arguments, dict) else {}})
    return blocks


async def messages(request: Request) -> Response:
    state, req, fields = await request_of(MESSAGES, request)
    job = await start(state, req, request)
    if req.stream:
        return sse_response(anthropic_stream.events(job, head(req, fields)), job, state.metrics.error,
                            f"{request.method} {request.url.path}", error_body, anthropic_stream.write)
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    body = {**head(req, fields), "content": content_blocks(out),
            "stop_reason": stop_reason(out.reason, job.stats.stop_word), "stop_sequence": job.stats.stop_word or None,
            "usage": usage(job), **out.detail}
    if out.trace is not None:
        body["speculative_trace"] = out.trace
    return JSONResponse(body)


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/messages would evaluate them: the same chat, tools and template."""
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    fields = parse(MessagesRequest, body)
    chat = chat_messages(fields)
    model = state.engine.target
    n = await count_chat_tokens(model, chat, tool_request(fields, chat, model), "messages", prefilled(chat, None, None))
    return JSONResponse({"input_tokens": n})
