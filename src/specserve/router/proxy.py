"""Passing a request to a model's child and its answer back, streamed as it comes (no buffering).

The body was read once (for its `model`) and is sent on as read. The client's credentials are the
router's to check: the child gets the router's own key instead. Hop-by-hop headers, Host and Origin
(the router checked it) stay behind. A child that goes away in the middle of an answer (unloaded past
its drain, crashed) ends the stream cleanly, with an error event where the format has one, instead of
leaving the client a broken connection.
"""
from __future__ import annotations

import json
import logging
from typing import Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..server.http.errors import ApiError
from .child import Child

log = logging.getLogger("specserve.router")
_REQUEST_DROPPED = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
                    b"proxy-authorization", b"authorization", b"x-api-key", b"origin", b"content-length"}
_RESPONSE_DROPPED = {"connection", "keep-alive", "transfer-encoding", "trailer", "upgrade",
                     "access-control-allow-origin", "access-control-allow-credentials", "vary"}


def client() -> httpx.AsyncClient:
    """The one connection pool to every child: no read deadline (a stream lasts as long as it generates)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request forwarded is noise
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


def _ending(content_type: str, message: str) -> bytes:
    """The last words of a stream whose child went away, in the stream's own format."""
    if content_type.startswith("text/event-stream"):
        return b"data: " + json.dumps({"error": {"message": message, "type": "server_error"}}).encode() + b"\n\n"
    if content_type.startswith("application/x-ndjson"):
        return json.dumps({"error": message}).encode() + b"\n"
    return b""


async def forward(http: httpx.AsyncClient, child: Child, request: Request, body: bytes,
                  done: Callable[[], None]) -> Response:
    """The child's answer to `request` (its body already read as `body`); `done()` once it has ended."""
    headers = [(k, v) for k, v in request.headers.raw if k not in _REQUEST_DROPPED]
    headers.append((b"authorization", b"Bearer " + child.key.encode()))
    query = request.url.query
    url = httpx.URL(child.url + request.url.path + (f"?{query}" if query else ""))
    try:
        upstream = await http.send(http.build_request(request.method, url, headers=headers, content=body),
                                   stream=True)
    except httpx.TransportError as e:
        done()
        raise ApiError(502, f"model '{child.name}': its process did not answer ({type(e).__name__}); "
                            "GET /models shows its status", "model", "model_unavailable") from None
    content_type = upstream.headers.get("content-type", "")
    sized = "content-length" in upstream.headers

    async def relay():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.TransportError as e:
            log.warning("model %s: its process went away during an answer (%s)", child.name, type(e).__name__)
            if not sized:
                yield _ending(content_type, f"model '{child.name}' stopped during this answer "
                                            "(unloaded or its process exited)")
        finally:
            await upstream.aclose()
            done()

    response = StreamingResponse(relay(), status_code=upstream.status_code)
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in upstream.headers.multi_items()
                            if k.lower() not in _RESPONSE_DROPPED]
    return response
