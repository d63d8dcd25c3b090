"""What OpenAI's endpoints share: the request fields they add, and the answer's shape (ids, usage, the
stream's end). Speculation shows up as extensions: a request's `speculative` object picks the mode and
lengths, `usage.speculative` reports what speculation did for it; with `speculative.trace`, each
choice's `speculative_trace` says who produced each token of its text (core/trace.py, docs/webui.md).
"""
from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..core.answer import speculative_usage
from ..core.jobs import CLIENT_GONE, Job
from ..core.request import GenRequest
from ..http.guard import KEY_SCOPE
from ..http.sse import sse_response
from .fields import Generation
from .validation import Fields


class StreamOptions(Fields):
    include_usage: bool | None = None


class OpenAIGeneration(Generation):
    """The shared fields, and OpenAI's `stream_options`."""

    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


def key_scope(request: Request) -> str | None:
    """The cross-request scope the request's API key confines it to (http/guard.py), if any."""
    return request.scope.get(KEY_SCOPE)


def head(kind: str, req: GenRequest) -> dict:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": req.model}


def traced(choice: dict, trace: list[dict] | None) -> dict:
    """The choice with its `speculative_trace` (core's runs of its text), where the request asked."""
    return choice if trace is None else {**choice, "speculative_trace": trace}


def usage(job: Job) -> dict:
    s = job.stats
    return {"prompt_tokens": s.n_prompt, "completion_tokens": s.n_generated,
            "total_tokens": s.n_prompt + s.n_generated, "prompt_tokens_details": {"cached_tokens": s.n_cached},
            "speculative": speculative_usage(job)}


async def stream_end(head: dict, last: dict, job: Job, include_usage: bool) -> AsyncIterator:
    """The final chunk with usage, a usage-only chunk if asked (stream_options.include_usage), [DONE]."""
    yield {**last, "usage": usage(job)}
    if include_usage:
        yield {**head, "choices": [], "usage": usage(job)}
    yield "[DONE]"


def stream(request: Request, job: Job, events: AsyncIterator) -> StreamingResponse:
    """The chunks `events` yields as server-sent events, errors in OpenAI's shape."""
    return sse_response(events, job, request.app.state.server.metrics.error, f"{request.method} {request.url.path}")


def respond(job: Job, body: dict | None) -> Response:
    """A whole answer with its usage, or CLIENT_GONE where the client left while it waited (`body` None)."""
    return Response(status_code=CLIENT_GONE) if body is None else JSONResponse({**body, "usage": usage(job)})
