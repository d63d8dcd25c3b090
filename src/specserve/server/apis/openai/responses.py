"""OpenAI's Responses API: POST /v1/responses and /v1/responses/input_tokens (and llama-server's
un-prefixed /responses), for Codex-style agents and `client.responses` of the openai SDK.

The body (protocol.py's model; request.py's declaration) becomes the one GenRequest: instructions and
input items as a chat in the templates' form, function tools through the core's tools grammar,
`text.format` as an output constraint, `max_output_tokens` and sampling over the request's profile, the
`speculative` object as on every API. The answer's events are shaped as a `response`
(responses_output.py) or streamed as Responses events (responses_stream.py). Stateless: nothing is
stored, so `previous_response_id` is refused with a 400 that says to send the conversation (a store
would hold each conversation in one process's memory, which replicas behind one endpoint do not share;
agents send the whole input anyway, and llama-server refuses it too). Errors keep OpenAI's shape.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.answer import Answer, answer
from ...core.jobs import CLIENT_GONE, start
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.sse import sse_response
from ...state import server_of
from ..shared.builder import request_of
from ..shared.generation_fields import check_unsupported, count_chat_tokens
from ..shared.validation import parse
from .protocol import ResponsesRequest
from .request import RESPONSES, chat_messages, check_stateless, tools_of
from .responses_output import ResponseHead, call_item, message_item, new_id, reasoning_item
from .responses_stream import ResponseStream


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/responses", responses), Endpoint("/responses", responses),
            Endpoint("/v1/responses/input_tokens", input_tokens), Endpoint("/responses/input_tokens", input_tokens)]


def _fields(body: dict) -> ResponsesRequest:
    fields = parse(ResponsesRequest, body)
    check_unsupported(body)
    check_stateless(fields)
    return fields


def output_items(out: Answer) -> list[dict]:
    """The whole answer's items: its text as a message (none when blank beside tool calls), then a
    function_call per call, after its reasoning item where it reasoned; the last is "incomplete" where
    max_output_tokens cut it."""
    items = [reasoning_item(new_id("rs"), out.reasoning)] if out.reasoning else []
    cut = out.cut_by_limit  # a call max_output_tokens cut: an incomplete function_call, its arguments so far
    if out.content and (out.content.strip() or not (out.calls or cut)):
        items.append(message_item(new_id("msg"), out.content))
    for call in [*out.calls, *([cut] if cut else [])]:
        items.append(call_item(new_id("fc"), call.id, call.name, call.arguments))
    if items and out.reason == "length":
        items[-1]["status"] = "incomplete"
    return items


async def responses(request: Request) -> Response:
    state, req, fields = await request_of(RESPONSES, request)
    job = await start(state, req, request)
    head = ResponseHead(req, fields)
    if req.stream:
        s = ResponseStream(job, head, bool(fields.timings_per_token), bool(fields.return_progress))
        return sse_response(s.events(), job, state.metrics.error, f"{request.method} {request.url.path}", s.error)
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    body = {**head.response("completed", output_items(out), job, out.reason), **out.detail}
    if out.trace is not None:
        body["speculative_trace"] = out.trace
    return JSONResponse(body)


async def input_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/responses would evaluate them (OpenAI's `responses.input_tokens.count`)."""
    state = server_of(request)
    fields = _fields(await read_json(request, state.settings.max_body, state.settings.read_timeout))
    chat = chat_messages(fields)
    tools = tools_of(fields, chat, state.engine.target)
    n = await count_chat_tokens(state.engine.target, chat, tools, "input")
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})
