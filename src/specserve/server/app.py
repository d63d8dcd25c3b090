"""The ASGI app: routes, API-key check, error shapes, lifespan.

`create_app(engine, settings)` is the whole server minus the HTTP listener; the
engine is passed in (loaded by `specserve serve` or a test) and stays the caller's
to close. Each app gets its own scheduler, slots and metrics registry.
"""
from __future__ import annotations

import contextlib
import hmac
import logging

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine import Engine
from ..memory import fmt_bytes
from . import llama_api, openai_api
from .errors import ApiError, error_response, install_handlers
from .state import ServerSettings, ServerState

log = logging.getLogger("specserve.server")
OPEN_PATHS = frozenset({"/health"})  # answered without an API key (load balancers probe it)


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer KEY`, except on OPEN_PATHS."""

    def __init__(self, app, key: str, on_error):
        self.app = app
        self.expected = b"Bearer " + key.encode()
        self.on_error = on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                self.on_error(401)
                message = "missing API key" if not given else "invalid API key"
                err = ApiError(401, f"{message}: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def health(request: Request) -> Response:
    info = request.app.state.server.health()
    return JSONResponse(info, status_code=503 if info["status"] == "draining" else 200)


async def metrics(request: Request) -> Response:
    m = request.app.state.server.metrics
    return Response(m.render(), headers={"Content-Type": m.content_type})


def create_app(engine: Engine, settings: ServerSettings) -> Starlette:
    """The server for `engine`. Closing the app (lifespan shutdown) frees its slots, not the engine."""
    state = ServerState(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("serving %s (profiles: %s) with %d slots (%s of KV cache and compute buffers each), queue %d",
                 settings.model_name, ", ".join(settings.profiles), settings.parallel,
                 fmt_bytes(state.scheduler.slot_bytes()), settings.queue)
        try:
            yield
        finally:
            state.scheduler.close()

    routes = [
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/models", openai_api.models, methods=["GET"]),
        Route("/completion", llama_api.completion, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = [Middleware(ApiKeyMiddleware, key=settings.api_key, on_error=state.metrics.error)] \
        if settings.api_key else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.server = state
    install_handlers(app, state.metrics.error)
    return app
