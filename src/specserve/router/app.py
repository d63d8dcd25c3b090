"""The router's HTTP side: its own endpoints (the model list and status, load, unload, Ollama's list and
ps) and every other request forwarded to the child of the model its body's `model` names (a GET: its
`?model=` query, as llama-server's router reads it).

A request that names no model goes to the one model there is (the only one loaded, else the only one
discovered); otherwise 400. An unknown name is 404 in the shape of the path's API, naming some that
exist; a name that looks like a file path is 400: the router serves what it discovered, by name.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..server.apis.anthropic.serving import error_body as anthropic_error
from ..server.apis.llama.props import BUILD_INFO
from ..server.apis.ollama.models import OLLAMA_VERSION
from ..server.apis.ollama.serving import error_body as ollama_error
from ..server.http.body import read_json, read_json_body
from ..server.http.errors import ApiError, CatchAll, ErrorShapes, install_handlers, openai_body
from ..server.http.guard import ApiKeyMiddleware, HostOriginGuard
from ..stores import looks_like_path, lookup
from . import listing, proxy
from .pool import Model, Pool
from .show import show_unloaded

log = logging.getLogger("specserve.router")
DISCONNECT_POLL_S = 0.25  # while a request waits for its model: how often the router looks whether its client left
_NOT_HERE = ("this router serves the GGUF models it discovered (--models-dir, --models-from): it does not pull, "
             "push, create, copy or delete models; use the tool that keeps them (ollama pull, ...)")


def _shape(path: str):
    """The error body of the path's API: Ollama's under /api/, Anthropic's under /v1/messages, else OpenAI's."""
    if path.startswith("/api/"):
        return ollama_error
    if path.startswith("/v1/messages"):
        return anthropic_error
    return openai_body


class Drain:
    """What the listener's drain watches (server/http/listener.py): the requests in flight through the router."""

    def __init__(self) -> None:
        self.active = 0
        self.draining = False
        self.stopping = False

    @property
    def idle(self) -> bool:
        return self.active == 0 or self.stopping

    def stop_requests(self) -> None:
        self.stopping = True


class Router:
    """What the router's app holds: the pool, the connection pool to the children, the drain, the settings."""

    def __init__(self, pool: Pool, settings, rediscover=None):
        self.pool = pool
        self.rediscover = rediscover  # () -> the models found now (GET /models?reload=1), or None
        self.settings = settings
        self.drain = Drain()
        self.http = None
        self.t_start = time.time()
        self.errors: dict[int, int] = {}

    def on_error(self, status: int) -> None:
        self.errors[status] = self.errors.get(status, 0) + 1

    def model(self, name) -> Model:
        """The model a request names (see the module docstring)."""
        pool = self.pool
        if name is None or name == "":
            only = [m.name for m in pool.loaded()] or pool.servable()
            if len(only) == 1:
                return pool.models[only[0]]
            raise ApiError(400, f"model is required: this router serves {len(pool.models)} models "
                                f"({_some(pool)}; GET /v1/models lists them)", "model")
        if not isinstance(name, str):
            raise ApiError(400, "model must be a string", "model")
        if looks_like_path(name):
            raise ApiError(400, f"model '{name[:200]}' looks like a file path: this router serves the models it "
                                f"discovered, by name ({_some(pool)})", "model", "model_is_path")
        found = lookup(name, list(pool.models))
        if found is None:
            raise ApiError(404, f"model '{name[:200]}' not found; this router serves {_some(pool)} "
                                "(GET /v1/models lists them all)", "model", "model_not_found")
        return pool.models[found]


def _some(pool: Pool, n: int = 5) -> str:
    names = pool.servable() or list(pool.models)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "") if names else "none"


def _router(request: Request) -> Router:
    return request.app.state.router


async def health(request: Request) -> Response:
    r = _router(request)
    return JSONResponse({"status": "draining" if r.drain.draining else "ok"},
                        status_code=503 if r.drain.draining else 200)


async def models(request: Request) -> Response:
    """Every model with its status; `?reload=1` discovers them again first (llama-server's)."""
    r = _router(request)
    if request.query_params.get("reload") in ("1", "true") and r.rediscover is not None:
        try:
            found = await anyio.to_thread.run_sync(r.rediscover)
        except ValueError as e:
            raise ApiError(422, f"discovering the models again failed: {e}", code="reload_failed") from None
        await r.pool.refresh(found)
    return JSONResponse({"object": "list", "data": [listing.openai_entry(m, r.t_start)
                                                     for m in r.pool.models.values()]})


async def _named(request: Request) -> Model:
    r = _router(request)
    body = await read_json(request, r.settings.max_body, r.settings.read_timeout)
    if not body.get("model"):
        raise ApiError(400, "model is required", "model")
    return r.model(body["model"])


async def load(request: Request) -> Response:
    r = _router(request)
    model = await _named(request)
    await r.pool.ensure(model, autoload=True, retry=True)
    return JSONResponse({"success": True})


async def unload(request: Request) -> Response:
    r = _router(request)
    model = await _named(request)
    if not await r.pool.unload(model):
        raise ApiError(400, f"model '{model.name}' is not loaded", "model", "model_not_loaded")
    return JSONResponse({"success": True})


async def tags(request: Request) -> Response:
    pool = _router(request).pool
    return JSONResponse({"models": [listing.ollama_entry(m) for m in pool.models.values() if m.found.error is None]})


async def ps(request: Request) -> Response:
    return JSONResponse({"models": [listing.ollama_entry(m, running=True) for m in _router(request).pool.loaded()]})


async def root(request: Request) -> Response:
    """GET /: what answers here (clients of Ollama's API probe / for a 200, as Ollama's 'Ollama is running')."""
    pool = _router(request).pool
    return PlainTextResponse(f"specserve router is running: {len(pool.models)} models, {len(pool.loaded())} "
                             "loaded (GET /v1/models lists them)\n")


async def props(request: Request) -> Response:
    """GET /props: with ?model=, that model's (forwarded); without, the router's own, as llama-server's router."""
    if request.query_params.get("model"):
        return await route(request)
    pool = _router(request).pool
    return JSONResponse({"role": "router", "max_instances": pool.max_loaded, "models_autoload": pool.autoload,
                         "build_info": BUILD_INFO, "models": len(pool.models), "loaded": len(pool.loaded())})


async def version(request: Request) -> Response:
    from .. import __version__

    return JSONResponse({"version": OLLAMA_VERSION, "specserve": __version__})


async def not_here(request: Request) -> Response:
    raise ApiError(501, f"{request.url.path} is not supported: {_NOT_HERE}", code="not_supported")


def _unloads(body: dict) -> bool:
    """Ollama's way to unload: /api/generate or /api/chat with keep_alive 0 and nothing to answer."""
    keep_alive = body.get("keep_alive")
    return keep_alive in (0, "0", "0s", "0m") and not body.get("prompt") and not body.get("messages")


async def _ensure_while_connected(request: Request, pool: Pool, model: Model, autoload: bool | None):
    """pool.ensure, given up (None) if the client goes away meanwhile: a load nobody waits for any more
    takes no model's place (llama-server's router does the same)."""
    task = asyncio.ensure_future(pool.ensure(model, autoload, hold=True))
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
                pool.release(model)  # it was done before the cancel reached it: held for nobody
            return None


async def route(request: Request) -> Response:
    """Any other request: to the child of the model it names, loaded first where it is not."""
    r = _router(request)
    if r.drain.draining:
        raise ApiError(503, "the router is stopping", headers={"Retry-After": "1"})
    if request.method in ("GET", "HEAD"):
        body, name = b"", request.query_params.get("model")
    else:
        fields, body = await read_json_body(request, r.settings.max_body, r.settings.read_timeout)
        name = fields.get("model") if "model" in fields else fields.get("name")  # /api/show's older spelling
        if request.url.path == "/api/show" and r.model(name).state != "loaded":  # no load to describe it
            model = r.model(name)
            shown = await anyio.to_thread.run_sync(show_unloaded, model)
            return JSONResponse({**shown, "modified_at": listing.ollama_entry(model)["modified_at"]})
        if request.url.path in ("/api/generate", "/api/chat") and _unloads(fields):
            model = r.model(name)
            await r.pool.unload(model)
            return JSONResponse({"model": model.name, "created_at": listing.now(), "response": "", "done": True,
                                 "done_reason": "unload"})
    model = r.model(name)
    autoload = request.query_params.get("autoload")
    child = await _ensure_while_connected(request, r.pool, model,
                                          None if autoload is None else autoload.lower() in ("1", "true", "yes"))
    if child is None:  # the client left while its model was loading or waiting for a place
        return Response(status_code=499)
    r.drain.active += 1

    def done() -> None:
        r.drain.active -= 1
        r.pool.release(model)

    return await proxy.forward(r.http, child, request, body, done)


def create_router_app(pool: Pool, settings, at_start: list[str] = (), rediscover=None) -> Starlette:
    """The router over `pool`, loading the models `at_start` names once it listens (a preset's
    load-on-startup); `rediscover()` finds the models again for `GET /models?reload=1`. Closing the app
    (lifespan shutdown) stops every child."""
    router = Router(pool, settings, rediscover)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        router.http = proxy.client()
        log.info("router: %d models (%d failed at discovery), at most %d loaded at once, autoload %s",
                 len(pool.models), len(pool.models) - len(pool.servable()), pool.max_loaded,
                 "on" if pool.autoload else "off")
        for name in at_start:
            pool.load_in_background(pool.models[name])
        try:
            yield
        finally:
            await pool.close()
            await router.http.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]
    routes = [Route("/", root, methods=["GET", "HEAD"]),
              Route("/health", health, methods=["GET"]), Route("/v1/health", health, methods=["GET"]),
              Route("/models", models, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
              Route("/models/load", load, methods=["POST"]), Route("/models/unload", unload, methods=["POST"]),
              Route("/api/tags", tags, methods=["GET"]), Route("/api/ps", ps, methods=["GET"]),
              Route("/api/version", version, methods=["GET"]), Route("/props", props, methods=["GET"]),
              *(Route(p, not_here, methods=["POST", "DELETE"]) for p in
                ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs/{digest}")),
              Route("/{path:path}", route, methods=methods)]
    shapes = PrefixShapes()
    middleware = [Middleware(CatchAll, on_error=router.on_error, shapes=shapes),
                  Middleware(HostOriginGuard, allowed_hosts=settings.allowed_hosts, cors_origins=settings.cors_origins,
                             on_error=router.on_error, shapes=shapes)]
    if settings.api_keys:
        middleware.append(Middleware(ApiKeyMiddleware, keys=settings.api_keys, on_error=router.on_error,
                                     scopes=settings.key_scopes, shapes=shapes))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.router = router
    install_handlers(app, router.on_error, shapes)
    return app


class PrefixShapes(ErrorShapes):
    """The error shape by path prefix (`_shape`): the router answers for every API's paths."""

    def __call__(self, path: str):
        return _shape(path)
