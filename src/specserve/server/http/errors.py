"""Errors: one exception for every refusal, answered in OpenAI's shape unless the API says otherwise.

`ApiError` carries what any API's error body needs (HTTP status, message, the field it names,
a machine-readable code). How it is written out is the API's: OpenAI's
`{"error": {"message", "type", "param", "code"}}` by default, so that OpenAI clients raise their
usual exception types; an adapter whose clients expect another shape (Anthropic's
`{"type": "error", "error": {"type", "message"}}`) gives its `Render` with its routes
(`Endpoint.render_error`), and `ErrorShapes` picks it by path. A bug is answered by `CatchAll`,
which leaves the keep-alive connection usable.
"""
from __future__ import annotations

import logging
from typing import Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("specserve.server")

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error", 503: "server_error"}


class ApiError(Exception):
    """A request the server refuses: the HTTP status, a message, the field it names (`param`, a path
    such as `tools[0].function.name`) and a code (`context_length_exceeded`)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        """OpenAI's shape."""
        return error_body(self.status, self.message, self.param, self.code)


Render = Callable[[ApiError], dict]  # an error -> the JSON body its API answers it with


def openai_body(err: ApiError) -> dict:
    return err.body()


class ErrorShapes:
    """The body shape of an error answered on a path: OpenAI's unless an adapter registered its own."""

    def __init__(self, by_path: dict[str, Render] | None = None, default: Render = openai_body):
        self.by_path = dict(by_path or {})
        self.default = default

    def __call__(self, path: str) -> Render:
        return self.by_path.get(path, self.default)


OPENAI_SHAPES = ErrorShapes()


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def error_response(err: ApiError, render: Render = openai_body) -> JSONResponse:
    return JSONResponse(render(err), status_code=err.status, headers=err.headers)


def install_handlers(app, on_error, shapes: ErrorShapes = OPENAI_SHAPES) -> None:
    """Answer refusals in the shape of the path's API; `on_error(status)` counts them. Bugs go to CatchAll."""

    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        on_error(exc.status)
        log.info("%d %s %s: %s", exc.status, request.method, request.url.path, exc.message)
        return error_response(exc, shapes(request.url.path))

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        on_error(exc.status_code)
        err = ApiError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
        return error_response(err, shapes(request.url.path))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)


class CatchAll:
    """The last resort for a bug (never a bad input): a 500 in OpenAI's shape, logged with its traceback.

    Starlette's own handler for `Exception` answers and then re-raises, and uvicorn, seeing
    an exception after a complete response, drops the keep-alive connection without
    `Connection: close`: the client's next request on it fails. Here the exception ends
    with the answer, so the connection stays usable. Once a response has started (a
    stream), nothing clean can be sent: the exception goes on and the connection closes.
    """

    def __init__(self, app, on_error, shapes: ErrorShapes = OPENAI_SHAPES):
        self.app = app
        self.on_error = on_error
        self.shapes = shapes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            self.on_error(500)
            log.error("internal error on %s %s", scope["method"], scope["path"], exc_info=exc)
            err = ApiError(500, f"internal server error: {type(exc).__name__}", code="internal_error")
            await error_response(err, self.shapes(scope["path"]))(scope, receive, send)
