"""Reading a request's body: size, time and media-type limits, then JSON that any tokenizer can take.

What fails here fails before any API looks at the request: 413 past the size limit, 415 unless sent
as JSON (a browser cannot send that cross-origin without a preflight), 408 if the body is slower than
the read timeout, 400 for bad UTF-8 or JSON, or a JSON value that is not an object.
"""
from __future__ import annotations

import asyncio
import json
import re

from starlette.requests import Request

from .errors import ApiError, bad_request

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the JSON escape of a UTF-16 surrogate: \ud800-\udfff


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The raw body: 413 past `limit` bytes, 408 if it takes over `timeout` seconds."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    return bytes(body)


async def read_json(request: Request, limit: int, timeout: float) -> dict:
    """The body as a JSON object (see the module docstring for what is refused, and how)."""
    return (await read_json_body(request, limit, timeout))[0]


async def read_json_body(request: Request, limit: int, timeout: float) -> tuple[dict, bytes]:
    """The body as a JSON object and as the bytes it came as (a proxy passes them on unchanged)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"the body must be sent as 'Content-Type: application/json', not {media_type or 'none'} "
                            "(curl: --json, or -H 'Content-Type: application/json')", code="unsupported_media_type")
    body = await read_body(request, limit, timeout)
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e.reason} at byte {e.start}",
                          code="invalid_encoding") from None
    except (ValueError, RecursionError) as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    try:  # JSON escapes can spell lone surrogates (\ud800), which no tokenizer takes; only a body that
        # has such an escape is checked whole (the check took 127 ms of the event loop for a 450 KB schema)
        if _SURROGATE_ESCAPE.search(body):
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("request body contains an unpaired surrogate escape (\\udXXX): not valid Unicode text",
                          code="invalid_encoding") from None
    if not isinstance(obj, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return obj, body
