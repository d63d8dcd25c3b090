"""Vertex AI's prediction route, as llama-server serves it when started with AIP_MODE=PREDICTION.

POST /predict {"instances": [{"@requestFormat": "chatCompletions", ...a body}, ...]} runs each instance
on the endpoint its @requestFormat names (llama-server's camelCase of the path: chatCompletions,
completions, completion, infill, tokenize, ... or the path itself), at once, never streamed, and answers
{"predictions": [each answer, or {"error": ...}]}. Each instance goes through the whole server as its
own request (the same key, limits and checks). Without AIP_MODE=PREDICTION the route answers 404.

One request's instances run at most half the slots at once (at least one), so that a request of 128
instances neither fills every slot nor the queue: other clients keep slots of their own. A client that
hangs up stops them all: the instances running are told of the disconnect as a request of their own is
(their generation ends), and those not yet started never start.
"""
from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import ApiError, bad_request, error_body
from ...state import server_of

MAX_INSTANCES = 128  # llama-server's
# @requestFormat -> path
FORMATS = {"chatCompletions": "/v1/chat/completions", "completions": "/v1/completions", "completion": "/completion",
           "infill": "/infill", "tokenize": "/tokenize", "detokenize": "/detokenize",
           "applyTemplate": "/apply-template", "chatCompletionsInputTokens": "/v1/chat/completions/input_tokens"}


def routes() -> list[Endpoint]:
    return [Endpoint("/predict", predict)]


async def _run(request: Request, path: str, body: dict, gone: asyncio.Event) -> dict:
    """`body` sent to `path` through the app, as a request of its own with this request's headers; it is
    told the client disconnected once `gone` is set."""
    data = json.dumps(body).encode()
    headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"content-length", b"content-type")]
    scope = {**request.scope, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [*headers, (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())]}
    sent = False
    out: dict = {"status": 500, "body": b""}

    async def receive():
        nonlocal sent
        if sent:
            await gone.wait()  # (returns at once once set: Request.is_disconnected's polls see it)
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    await request.app(scope, receive, send)
    try:
        return json.loads(out["body"])
    except ValueError:
        return error_body(out["status"], out["body"].decode("utf-8", "replace")[:200])


async def predict(request: Request) -> Response:
    state = server_of(request)
    if not state.settings.gcp_predict:
        raise ApiError(404, "Not Found: /predict is served with AIP_MODE=PREDICTION (Vertex AI)")
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    instances = body.get("instances")
    if not isinstance(instances, list):
        raise bad_request("the body must hold an array field named instances", "instances")
    if len(instances) > MAX_INSTANCES:
        raise bad_request(f"instances holds at most {MAX_INSTANCES}", "instances")

    share = asyncio.Semaphore(max(1, state.n_slots // 2))
    gone = asyncio.Event()

    async def one(i: int, instance) -> dict:
        async with share:
            if gone.is_set():
                return error_body(499, "the client closed the connection", code="client_gone")
            return await _instance(i, instance)

    async def _instance(i: int, instance) -> dict:
        fmt = instance.get("@requestFormat") if isinstance(instance, dict) else None
        if not isinstance(fmt, str):
            return error_body(400, f"instances[{i}] must be an object with a string @requestFormat",
                              f"instances[{i}]")
        path = FORMATS.get(fmt, fmt if fmt in FORMATS.values() else None)
        if path is None:
            return error_body(400, f"no endpoint for @requestFormat {fmt!r}: {', '.join(FORMATS)}", f"instances[{i}]")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        payload["stream"] = False  # the predict route does not stream
        return await _run(request, path, payload, gone)

    async def watch() -> None:  # the only reader of the client's messages once the body is read
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    try:
        predictions = await asyncio.gather(*(one(i, x) for i, x in enumerate(instances)))
    finally:
        watcher.cancel()
    return JSONResponse({"predictions": predictions})
