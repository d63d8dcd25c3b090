"""Server-sent events: a stream of JSON objects that always ends by finishing what produced it.

`sse_response` writes each object an answer's event generator yields as one event; however the
stream ends (done, client gone, drain deadline, error) the generation behind it is finished, so its
slot is freed. After the headers an error can only be an event: the API's error body (OpenAI's:
`{"error": ...}`, which OpenAI's clients raise) and no end marker. An API whose events are named
(Anthropic's `event: message_start`) passes its own `write`.
"""
from __future__ import annotations

import json
import logging
from typing import AsyncIterator, Awaitable, Callable, Protocol

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from .errors import ApiError, Render, openai_body

log = logging.getLogger("specserve.server")


class Finishing(Protocol):
    """What a stream's producer must offer: stop at once (idempotent), and wait until accounted for."""

    def finish(self) -> None: ...

    def finished(self) -> Awaitable[None]: ...


def sse(obj) -> str:
    """One `data:` event: a JSON object, or a string as it is (OpenAI's `[DONE]`)."""
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)) + "\n\n"


def sse_response(events: AsyncIterator, job: Finishing, on_error: Callable[[int], None], where: str,
                 render: Render = openai_body, write: Callable[[object], str] = sse,
                 media_type: str = "text/event-stream") -> StreamingResponse:
    """Stream `events` as server-sent events (`write` makes each one's text; an API whose stream is not
    server-sent events, Ollama's JSON lines, gives its own and its `media_type`); `job` is finished
    however the stream ends. `on_error(status)` counts a failure; `where` names the request in logs."""

    async def body():
        try:
            async for obj in events:
                yield write(obj)
            await job.finished()  # the stream's end means the request is accounted for
        except ApiError as e:  # a refusal mid-stream: the drain's deadline, a grammar's dead end
            on_error(e.status)
            log.info("%d %s mid-stream: %s", e.status, where, e.message)
            yield write(render(e))
        except Exception as e:  # headers are sent: the error goes in the stream
            log.exception("error while streaming")
            on_error(500)
            yield write(render(ApiError(500, f"internal server error: {type(e).__name__}", code="internal_error")))
        finally:
            job.finish()

    return StreamingResponse(body(), media_type=media_type, background=BackgroundTask(job.finish),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
