"""--sleep-idle-seconds: after N seconds with nothing to do, free the models; the next request loads them again.

Asleep, the server holds no weights, no slots' caches and no engine thread: only what was read from the
models (metadata, vocabulary, token pieces), the auto controller's learning (also saved, as at exit) and the
cross-request store stay in memory. /health, /props (`is_sleeping`), /metrics, /slots, /models and
/v1/models answer from that without waking it, as llama-server's do; every endpoint that needs the model
(generation, tokenizing, templates: Endpoint.needs_model) wakes it first (WakeOnRequest). Requests
arriving during the wake wait for it, and none is lost: a failed wake answers them 503 and the next
request tries again.

Every change of state happens on the event loop under one lock, with `users` (requests past the guards on
an endpoint that needs the model, counted from arrival to their last byte) read there: the server goes to
sleep only when no request is in flight, queued or being closed, and no grammar compile is running
(a compile past its budget goes on after its request has been answered, on the vocabulary being freed).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Callable

import anyio
from starlette.routing import Match, Route

from ...memory import fmt_bytes, rss_bytes, trim_heap
from ..http.errors import ApiError, ErrorShapes, error_response
from .scheduler import draining
from .server_parts import ServerParts

log = logging.getLogger("specserve.server")
POLL_S = 0.25  # how often the idle time is looked at (at most a quarter of it)


class Sleeper:
    """The sleep/wake state of one server: `awake()` around every request that needs the model, `watch()`
    as a task for the server's lifetime."""

    def __init__(self, state: ServerParts, idle_s: float):
        self.state, self.idle_s = state, idle_s
        self.unloaded = False  # a request must wake it first: from the start of freeing to the end of loading
        self.asleep = False  # what /props and /health say: the memory is given back, until loaded again
        self.users = 0  # requests holding `awake()`
        self.last_used = time.monotonic()
        self.prepare: Callable[[], None] = lambda: None  # what start-up readies besides the models (app.py)
        self._lock = asyncio.Lock()  # one change of state at a time; requests that arrive asleep queue on it
        self._closed = False

    @contextlib.asynccontextmanager
    async def awake(self):
        """Hold the models loaded for the block, loading them first if the server sleeps; yields None, or the
        ApiError (503) to answer where they could not be loaded."""
        self.users += 1  # before any await: from here no sleep can start
        try:
            failed = None
            if self.unloaded:
                async with self._lock:
                    if self.unloaded:
                        failed = await self._wake()
            yield failed
        finally:
            self.users -= 1
            self.last_used = time.monotonic()

    def idle(self) -> bool:
        s = self.state.scheduler
        return (self.users == 0 and s.idle and s.pool.releasing == 0 and not s.draining
                and not self.state.grammars.busy)

    async def watch(self) -> None:
        """Put the server to sleep once it has been idle for idle_s seconds; runs until cancelled."""
        while True:
            await asyncio.sleep(min(POLL_S, self.idle_s / 4))
            if self.unloaded or not self.idle() or time.monotonic() - self.last_used < self.idle_s:
                continue
            async with self._lock:
                if not self.unloaded and not self._closed and self.idle():
                    await self._sleep()

    async def close(self) -> None:
        """At shutdown: wait for a change of state in progress, then allow none."""
        async with self._lock:
            self._closed = True

    async def _sleep(self) -> None:
        self.unloaded = True  # from here a request waits for the wake (on the lock this holds)
        rss, t = rss_bytes(), time.perf_counter()
        try:
            await anyio.to_thread.run_sync(self._unload)
        except Exception:  # the models are half freed: nothing can be served until they are loaded again
            log.exception("while going to sleep")
        self.asleep = True
        log.info("asleep after %g s without requests: models and slots' caches freed in %.2f s (resident memory "
                 "%s -> %s)", self.idle_s, time.perf_counter() - t, fmt_bytes(rss), fmt_bytes(rss_bytes()))

    async def _wake(self) -> ApiError | None:
        if self._closed or self.state.scheduler.draining:
            return draining()
        t = time.perf_counter()
        log.info("waking: a request needs the model")
        try:
            await anyio.to_thread.run_sync(self._load)
        except Exception as e:
            log.exception("the models could not be loaded again")
            return ApiError(503, f"the server was asleep and could not load its models again: {e}",
                            code="wake_failed", headers={"Retry-After": "5"})
        self.unloaded = self.asleep = False
        log.info("awake: models and slots loaded again in %.2f s (resident memory %s)", time.perf_counter() - t,
                 fmt_bytes(rss_bytes()))
        return None

    def _unload(self) -> None:
        """Off the event loop: the engine thread and the slots' contexts first, then the weights."""
        engine = self.state.engine
        self.state.scheduler.unload()
        self.state.close_embedder()
        if engine.controller is not None:
            engine.controller.save()  # kept in memory too; saved as at exit, in case the process ends asleep
        for model in (engine.draft, engine.target):
            if model is not None:
                model.unload()
        trim_heap()

    def _load(self) -> None:
        engine = self.state.engine
        for model in (engine.target, engine.draft):
            if model is not None:
                model.reload()
        self.state.scheduler.reload()
        self.prepare()


class WakeOnRequest:
    """ASGI middleware (inside the guards, so a refused request wakes nothing): a request on one of
    `routes` runs inside `sleeper.awake()`, its response streamed to the end included."""

    def __init__(self, app, sleeper: Sleeper, routes: list[Route], on_error, shapes: ErrorShapes):
        self.app, self.sleeper, self.routes = app, sleeper, routes
        self.on_error, self.shapes = on_error, shapes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not any(r.matches(scope)[0] == Match.FULL for r in self.routes):
            await self.app(scope, receive, send)
            return
        async with self.sleeper.awake() as woken:
            if woken is None:
                await self.app(scope, receive, send)
            else:  # the wake failed, or the server is shutting down: answered here, as the guards answer
                self.on_error(woken.status)
                await error_response(woken, self.shapes(scope["path"]))(scope, receive, send)
