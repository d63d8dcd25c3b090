"""What every API's answer may carry the same way: a stream of chunks as server-sent events, and the
speculative trace (core/trace.py) beside a choice or chunk where the request asks for it."""
from __future__ import annotations

from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ...core.jobs import Job
from ...http.sse import sse_response
from ...state import server_of


def traced(choice: dict, trace: list[dict] | None) -> dict:
    """The choice with its `speculative_trace` (core's runs of its text), where the request asked."""
    return choice if trace is None else {**choice, "speculative_trace": trace}


def stream(request: Request, job: Job, events: AsyncIterator) -> StreamingResponse:
    """The chunks `events` yields as server-sent events, errors in OpenAI's shape."""
    return sse_response(events, job, server_of(request).metrics.error, f"{request.method} {request.url.path}")
