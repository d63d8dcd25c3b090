"""The ASGI app: each API adapter's routes, the server's own (/health, /metrics, the page), access
checks, error shapes, lifespan.

`create_app(engine, settings)` is the whole server minus the HTTP listener; the
engine is passed in (loaded by `specserve serve` or a test) and stays the caller's
to close. Each app gets its own scheduler, slots and metrics registry. An API is added by
listing its module in ADAPTERS: its `routes()` gives its `Endpoint`s (with the API's own error
shape, if it has one), an optional `prepare(target)` runs at start-up, off the event loop, before the
server answers, and again when a sleeping server wakes (--sleep-idle-seconds: core/sleep.py, which wraps
the endpoints that need the model); an optional `warm(target)` builds what can wait, beside the first
requests (`warm` in create_app).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..engine import Engine
from ..memory import fmt_bytes
from . import webui
from .apis.anthropic import serving as messages
from .apis.llama import completion, gcp, infill, props, templates
from .apis.ollama import embed as ollama_embed
from .apis.ollama import models as ollama_models
from .apis.ollama import serving as ollama
from .apis.openai import chat, completions, embeddings, models, responses
from .core.sleep import WakeOnRequest
from .http.endpoint import Endpoint
from .http.errors import OPENAI_SHAPES, CatchAll, ErrorShapes, install_handlers
from .http.guard import OPEN_PATHS, ApiKeyMiddleware, HostOriginGuard, key_scope
from .state import ServerSettings, ServerState, server_of

ADAPTERS = (completions, chat, models, completion, infill, messages, responses,  # one module per endpoint (or a few)
            props, templates, gcp, ollama, ollama_models, ollama_embed, embeddings)

log = logging.getLogger("specserve.server")


async def health(request: Request) -> Response:
    info = server_of(request).health()
    return JSONResponse(info, status_code=503 if info["status"] == "draining" else 200)


async def metrics(request: Request) -> Response:
    """The whole server's metrics, or, for a key confined to a scope, that scope's requests alone."""
    state = server_of(request)
    m = state.metrics
    response = Response(m.render(key_scope(request.scope)), headers={"Content-Type": m.content_type})
    # llama-server's header, in its own case: clients that read headers into a plain dict look it up so
    response.raw_headers.append((b"Process-Start-Time-Unix", str(int(state.t_start)).encode()))
    return response


WARM_QUIET_S = 1.0  # the builders wait for this long without a request running (warm, below)...
WARM_WAIT_S = 30.0  # ...but no longer than this


def create_app(engine: Engine, settings: ServerSettings) -> Starlette:
    """The server for `engine`. Closing the app (lifespan shutdown) frees its slots, not the engine."""
    state = ServerState(engine, settings)
    endpoints: list[Endpoint] = [e for adapter in ADAPTERS for e in adapter.routes()]
    shapes = ErrorShapes({e.path: e.render_error for e in endpoints if e.render_error is not None})

    def prepare() -> None:
        """What must be ready before the first request; at start-up, and again at each wake."""
        for adapter in ADAPTERS:
            if hasattr(adapter, "prepare"):
                adapter.prepare(engine.target)

    closing = threading.Event()

    def warm() -> None:
        """What the first requests that need it would otherwise build (the grammar tokenizer, the vocabulary's
        bytes: ~2.5 s for a 152k vocabulary), built once the server has run no request for a second, instead of
        before it listens: a router's switch to this model waits only for the model, and its first answer
        does not share the CPU with the builders. A request that needs one first builds it itself; each is
        built once (locks in the builders)."""
        builders = [getattr(a, "warm") for a in ADAPTERS if hasattr(a, "warm")] + [
            lambda target: target.grammar_tokenizer()]  # None where the backend cannot constrain
        for build in builders:
            waited = quiet = 0.0
            while quiet < WARM_QUIET_S and waited < WARM_WAIT_S and not closing.is_set():
                closing.wait(0.05)
                waited += 0.05
                quiet = 0.0 if state.scheduler.active else quiet + 0.05
            if closing.is_set():
                return
            build(engine.target)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        log.info("serving %s (profiles: %s) with %d slots (%s of KV cache and compute buffers each), queue %d",
                 settings.model_name, ", ".join(settings.profiles), settings.parallel,
                 fmt_bytes(state.scheduler.slot_bytes()), settings.queue)
        await anyio.to_thread.run_sync(prepare)
        warming = threading.Thread(target=warm, name="specserve-warm", daemon=True)
        warming.start()
        watch = None
        if state.sleeper is not None:
            state.sleeper.prepare = prepare  # what warm builds, a request that needs it builds after a wake

            async def watch_once_warm():  # the models are not freed under the builders' feet
                await anyio.to_thread.run_sync(warming.join)
                await state.sleeper.watch()

            watch = asyncio.create_task(watch_once_warm())
            log.info("sleeps after %g s without requests (--sleep-idle-seconds)", settings.sleep_idle_seconds)
        try:
            yield
        finally:
            closing.set()
            await anyio.to_thread.run_sync(warming.join)  # it reads the vocabulary the caller frees after us
            if watch is not None:
                watch.cancel()
                await state.sleeper.close()  # after a wake in progress, none more
            state.grammars.close()
            state.scheduler.close()
            state.close_embedder()  # the engine thread has stopped; the weights are freed after (the caller's)

    routes = [*(e.route() for e in endpoints),
              Route("/health", health, methods=["GET"]), Route("/v1/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]),
              *(webui.routes() if settings.webui else [])]
    middleware = access_middleware(settings, state.metrics.error, shapes)
    if state.sleeper is not None:  # innermost: a request the guards refuse wakes nothing
        middleware.append(Middleware(WakeOnRequest, sleeper=state.sleeper, on_error=state.metrics.error,
                                     shapes=shapes, routes=[e.route() for e in endpoints if e.needs_model]))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.server = state
    install_handlers(app, state.metrics.error, shapes)
    return app


def access_middleware(settings: ServerSettings, on_error, shapes: ErrorShapes = OPENAI_SHAPES) -> list[Middleware]:
    """The checks in front of every route: bugs answered cleanly (outermost), then who may call
    (the guard answers an allowed origin's CORS preflight, which carries no key), each refusal in the shape
    of its path's API. Shared with the replica ingress (specserve.cluster)."""
    middleware = [Middleware(CatchAll, on_error=on_error, shapes=shapes),
                  Middleware(HostOriginGuard, allowed_hosts=settings.allowed_hosts,
                             cors_origins=settings.cors_origins, on_error=on_error, shapes=shapes)]
    if settings.api_keys:
        middleware.append(Middleware(ApiKeyMiddleware, keys=settings.api_keys, on_error=on_error,
                                     scopes=settings.key_scopes, shapes=shapes,
                                     open_paths=OPEN_PATHS | webui.PATHS if settings.webui else OPEN_PATHS))
    return middleware
