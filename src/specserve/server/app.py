"""The ASGI app: routes, access checks, error shapes, lifespan.

`create_app(engine, settings)` is the whole server minus the HTTP listener; the
engine is passed in (loaded by `specserve serve` or a test) and stays the caller's
to close. Each app gets its own scheduler, slots and metrics registry.
"""
from __future__ import annotations

import contextlib
import logging

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine import Engine
from ..memory import fmt_bytes
from . import infill, llama_api, openai_api, webui
from .errors import CatchAll, install_handlers
from .guard import KEY_SCOPE, OPEN_PATHS, ApiKeyMiddleware, HostOriginGuard
from .state import ServerSettings, ServerState

log = logging.getLogger("specserve.server")


async def health(request: Request) -> Response:
    info = request.app.state.server.health()
    return JSONResponse(info, status_code=503 if info["status"] == "draining" else 200)


async def metrics(request: Request) -> Response:
    """The whole server's metrics, or, for a key confined to a scope, that scope's requests alone."""
    m = request.app.state.server.metrics
    return Response(m.render(request.scope.get(KEY_SCOPE)), headers={"Content-Type": m.content_type})


def create_app(engine: Engine, settings: ServerSettings) -> Starlette:
    """The server for `engine`. Closing the app (lifespan shutdown) frees its slots, not the engine."""
    state = ServerState(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("serving %s (profiles: %s) with %d slots (%s of KV cache and compute buffers each), queue %d",
                 settings.model_name, ", ".join(settings.profiles), settings.parallel,
                 fmt_bytes(state.scheduler.slot_bytes()), settings.queue)
        await anyio.to_thread.run_sync(infill.prepare, engine.target)
        if hasattr(engine.target, "grammar_tokenizer"):  # built now, not by the first constrained request
            await anyio.to_thread.run_sync(engine.target.grammar_tokenizer)
        try:
            yield
        finally:
            state.grammars.close()
            state.scheduler.close()

    routes = [
        Route("/v1/completions", openai_api.completions, methods=["POST"]),
        Route("/v1/chat/completions", openai_api.chat_completions, methods=["POST"]),
        Route("/v1/models", openai_api.models, methods=["GET"]),
        Route("/completion", llama_api.completion, methods=["POST"]),
        Route("/infill", infill.infill, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *(webui.routes() if settings.webui else []),
    ]
    middleware = access_middleware(settings, state.metrics.error)
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.server = state
    install_handlers(app, state.metrics.error)
    return app


def access_middleware(settings: ServerSettings, on_error) -> list[Middleware]:
    """The checks in front of every route: bugs answered cleanly (outermost), then who may call
    (a CORS preflight carries no key). Shared with the replica ingress (specserve.cluster)."""
    middleware = [Middleware(CatchAll, on_error=on_error),
                  Middleware(HostOriginGuard, allowed_hosts=settings.allowed_hosts,
                             cors_origins=settings.cors_origins, on_error=on_error)]
    if settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(settings.cors_origins),
                                     allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type", "X-Api-Key"], max_age=600))
    if settings.api_keys:
        middleware.append(Middleware(ApiKeyMiddleware, keys=settings.api_keys, on_error=on_error,
                                     scopes=settings.key_scopes,
                                     open_paths=OPEN_PATHS | webui.PATHS if settings.webui else OPEN_PATHS))
    return middleware
