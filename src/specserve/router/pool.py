"""The router's models: which are loaded, loading a child, unloaded or failed, and the loads and unloads.

A request's model is loaded on demand (unless --no-models-autoload), once however many requests ask for
it at the same moment: they all wait on the one load. At most `max_loaded` children run (loading ones
count): a load past that first unloads the least recently used loaded model that answers no request,
and waits for its process to exit, so that its memory is free before the next one takes it. Where
every place is taken by a model loading or answering, the load waits for one to finish (PLACE_WAIT_S
at most, then 429 with Retry-After).

A model whose child exited before it was ready failed: requests for it get 422 with why, until an
explicit POST /models/load tries again. One that crashes after it was serving is shown failed with
why; the next request for it loads it again. A model discovery found broken (a missing blob) is never
started.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from ..memory import fmt_bytes
from ..server.http.errors import ApiError
from ..stores import Found
from .child import STOP_TIMEOUT_S, Child, ChildFailed

log = logging.getLogger("specserve.router")
LOAD_TIMEOUT_S = 300.0
PLACE_WAIT_S = 60.0  # a load waits this long for a place among --models-max before 429


_PATH = re.compile(r"(?<![\w.:-])(?:~|\.{1,2})?(?:/[^\s/'\"():,]+)+/([^\s/'\"():,]+)")  # a path, from its start


def redact(text: str) -> str:
    """`text` with each file path cut to its last part: what clients are told names files, never the
    host's folders (the log keeps them whole)."""
    return _PATH.sub(r"\1", text)


def _own(args: list[str]) -> list[str]:
    """A child's flags less its --draft-candidates (the other models: they change as models come and go)."""
    out, skip = [], False
    for a in args:
        if skip or a == "--draft-candidates":
            skip = not skip
            continue
        out.append(a)
    return out


class _NoOneWaits(Exception):
    """A load whose requests all went away before it had a place: it unloads nothing for nobody."""


@dataclass
class Model:
    """A discovered model and its child, if it has one. `args` is the child's command line after `serve`."""
    found: Found
    args: list[str]
    draft: str | None = None  # the draft model given by the preset, as named there (None: none)
    state: str = "unloaded"  # unloaded, loading, loaded
    child: Child | None = None
    failure: str | None = None  # why it failed (None: it did not)
    exit_code: int | None = None
    failed_loading: bool = False  # it never became ready: autoload does not retry it
    last_used: float = 0.0
    in_flight: int = 0  # requests being answered
    waiting: int = 0  # requests waiting for its load
    draft_choice: dict | None = None  # the child's -md auto choice and why, as its /props says (file names only)
    memory: int | None = None  # estimated bytes of its child (--models-memory; budget.py), once estimated
    memory_note: str = ""  # how they add up
    loading: asyncio.Task | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.found.name

    def status(self) -> dict:
        """llama-server's `status` object (value loaded, loading or unloaded; failed with exit_code), and why."""
        out: dict = {"value": self.state}
        if self.state != "unloaded":
            out["args"] = ["specserve", "serve", *map(redact, self.args)]  # files by name, as everywhere
        reason = redact(self.found.error or self.failure or "")
        if reason:
            out.update(failed=True, reason=reason)
            if self.exit_code is not None:
                out["exit_code"] = self.exit_code
        return out


class Pool:
    """The models by name, at most `max_loaded` of them in children at once."""

    def __init__(self, models: list[Model], key: str, max_loaded: int = 4, autoload: bool = True,
                 load_timeout: float = LOAD_TIMEOUT_S, stop_timeout: float = STOP_TIMEOUT_S,
                 place_wait: float = PLACE_WAIT_S, budget: int | None = None,
                 estimate: Callable[[Model], tuple[int, str]] | None = None):
        if max_loaded < 1:
            raise ValueError(f"--models-max must be >= 1, got {max_loaded}")
        self.models = {m.name: m for m in models}
        self.key = key
        self.max_loaded = max_loaded
        self.autoload = autoload
        self.load_timeout = load_timeout
        self.stop_timeout = stop_timeout
        self.place_wait = place_wait
        self.budget = budget  # bytes all children may take together (None: no budget)
        self.estimate = estimate
        self._places = asyncio.Lock()  # choosing what to unload and taking a place: one load at a time
        self._change = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    def servable(self) -> list[str]:
        return [n for n, m in self.models.items() if m.found.error is None]

    def loaded(self) -> list[Model]:
        return [m for m in self.models.values() if m.state == "loaded"]

    async def ensure(self, model: Model, autoload: bool | None = None, retry: bool = False,
                     hold: bool = False) -> Child:
        """The model's child, ready; loaded first where it is not (all callers share one load). `hold`: count
        a request in flight on it from the moment it is returned (the caller calls `release` at its end), so
        that no load unloads it in between. ApiError: 422 a model that failed, 400 an unloaded one with
        autoload off, 429 no place."""
        model.last_used = time.monotonic()
        for _ in range(3):  # loaded, then unloaded before this request had it (POST /models/unload): again
            if model.state == "loaded" and model.child is not None and model.child.alive:
                model.in_flight += hold
                return model.child
            if model.found.error:
                raise ApiError(422, f"model '{model.name}' cannot be served: {redact(model.found.error)}", "model",
                               "model_failed")
            if model.loading is None:
                if not (self.autoload if autoload is None else autoload):
                    raise ApiError(400, f"model '{model.name}' is not loaded and this router loads models only "
                                        "when asked (--no-models-autoload): POST /models/load {\"model\": NAME} "
                                        "first", "model", "model_not_loaded")
                if model.failed_loading and not retry:
                    raise ApiError(422, f"model '{model.name}' failed to load: {redact(model.failure)} "
                                        "(POST /models/load tries again)", "model", "model_failed")
                model.loading = asyncio.create_task(self._load(model))
            model.waiting += 1  # a model with requests waiting for it is not unloaded to make room
            try:
                await asyncio.shield(model.loading)  # a request that goes away does not cancel the others' load
            finally:
                model.waiting -= 1
        raise ApiError(429, f"model '{model.name}' was unloaded each time it was loaded; retry later", "model",
                       "too_many_models", headers={"Retry-After": "2"})

    async def _load(self, model: Model) -> None:
        try:
            await self._estimate(model)
            async with self._places:
                try:
                    await self._make_room(model)
                except _NoOneWaits:
                    log.info("model %s: not loaded, no request waits for it any more", model.name)
                    return
                model.state = "loading"
            log.info("model %s: loading (%s)", model.name, " ".join(model.args))
            try:
                child = await self._start(model)
            except ChildFailed as e:
                model.state, model.failure, model.exit_code, model.failed_loading = "unloaded", e.reason, \
                    e.exit_code, True
                log.error("model %s failed to load: %s", model.name, e.reason)
                raise ApiError(422, f"model '{model.name}' failed to load: {redact(e.reason)}", "model",
                               "model_failed") from None
            except BaseException:
                model.state = "unloaded"
                raise
            model.draft_choice = (await child.props()).get("draft_choice") or model.draft_choice
            model.child, model.state = child, "loaded"
            model.failure, model.exit_code, model.failed_loading = None, None, False
            log.info("model %s: loaded in %.2f s on port %d", model.name, time.monotonic() - child.started_at,
                     child.port)
            self._spawn(self._watch(model, child))
        finally:
            model.loading = None
            self.changed()

    async def _start(self, model: Model, tries: int = 3) -> Child:
        """A ready child for `model`. The free port it was given may be taken before it listens (another
        program's bind in between): then again, on another port, `tries` times in all."""
        attempt = 0
        while True:
            attempt += 1
            child = Child(model.name, model.args, self.key)
            try:
                await child.start(self.load_timeout)
                return child
            except ChildFailed as e:
                taken = "already in use" in e.reason or "cannot listen on" in e.reason
                if not taken or attempt == tries:
                    raise
                log.warning("model %s: port %d was taken, trying another", model.name, child.port)
            except BaseException:
                child.kill_now()
                raise

    async def _make_room(self, model: Model) -> None:
        """Unload the least recently used idle models until `model` has a place; where every place is taken by
        a model loading or answering, wait (PLACE_WAIT_S at most, then 429) for one to finish."""
        deadline = time.monotonic() + self.place_wait
        while True:
            if not model.waiting:  # its requests went away while it waited for a place: it takes none
                raise _NoOneWaits
            busy = [m for m in self.models.values() if m is not model and m.state in ("loaded", "loading")]
            used = sum(m.memory or 0 for m in busy)
            if len(busy) < self.max_loaded and (self.budget is None or used + (model.memory or 0) <= self.budget):
                return
            idle = sorted((m for m in busy if m.state == "loaded" and not m.in_flight and not m.waiting),
                          key=lambda m: m.last_used)
            if idle:
                log.info("model %s: unloading %s, the least recently used, for it (--models-max %d%s)",
                         model.name, idle[0].name, self.max_loaded,
                         "" if self.budget is None else f", --models-memory {fmt_bytes(self.budget)}")
                await self.unload(idle[0])
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApiError(429, f"no place for model '{model.name}': the {len(busy)} models running (at most "
                                    f"{self.max_loaded}, --models-max; {fmt_bytes(used)} of "
                                    f"{fmt_bytes(self.budget) if self.budget else 'unlimited'} memory) are all "
                                    "loading or answering; retry later", "model", "too_many_models",
                               headers={"Retry-After": "2"})
            change = self._change
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(change.wait(), left)

    async def _estimate(self, model: Model) -> None:
        """The model's memory (once), and 422 with the numbers where it could never fit the budget."""
        if self.budget is None or self.estimate is None:
            return
        if model.memory is None:
            try:
                model.memory, model.memory_note = await asyncio.to_thread(self.estimate, model)
            except (OSError, ValueError) as e:  # counted as nothing, and said so
                model.memory, model.memory_note = 0, f"not estimated: {e}"
                log.warning("model %s: memory %s", model.name, model.memory_note)
        if model.memory > self.budget:
            raise ApiError(422, f"model '{model.name}' needs about {model.memory_note}, more than the router's "
                                f"memory budget of {fmt_bytes(self.budget)} (--models-memory) on its own",
                           "model", "model_too_large")

    def release(self, model: Model) -> None:
        """A request held by `ensure(hold=True)` has ended."""
        model.in_flight -= 1
        model.last_used = time.monotonic()
        self.changed()

    def changed(self) -> None:
        """A request ended, or a model was loaded or unloaded: a load waiting for a place looks again."""
        self._change.set()
        self._change = asyncio.Event()

    async def _watch(self, model: Model, child: Child) -> None:
        """A child that exits without being asked to has crashed: its model is shown failed with why."""
        code = await child.wait()
        if child.stopping:
            return
        if model.child is child:
            model.child, model.state = None, "unloaded"
            model.failure, model.exit_code = f"crashed: {child.reason()}", code
        log.error("model %s: its process exited with status %s: %s", model.name, code, child.reason())

    async def unload(self, model: Model) -> bool:
        """Stop the model's child (its requests in flight drain first); False where it was not loaded."""
        if model.loading is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(model.loading)
        child = model.child
        if child is None:
            return False
        model.child, model.state = None, "unloaded"
        log.info("model %s: unloading", model.name)
        await child.stop(self.stop_timeout)
        self.changed()
        return True

    async def refresh(self, found: list[Model]) -> None:
        """llama-server's `GET /models?reload=1`: models found now are added, or replace the ones of their name
        whose file or flags changed (unloaded first, where loaded); ones no longer found are removed (unloaded
        first)."""
        new = {m.name: m for m in found}
        for name, old in list(self.models.items()):
            fresh = new.get(name)
            if fresh is not None and (fresh.found, _own(fresh.args)) == (old.found, _own(old.args)):
                old.args = fresh.args  # the same model (its draft candidates may differ: its next start sees them)
                new[name] = old  # it keeps its state, its child
                continue
            if old.loading is not None or old.child is not None:
                await self.unload(old)
        self.models = new
        self.changed()

    def load_in_background(self, model: Model) -> None:
        """Load without a request waiting (a preset's load-on-startup): a failure shows in its status."""
        async def load() -> None:
            with contextlib.suppress(ApiError):
                await self.ensure(model, autoload=True)
        self._spawn(load())

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop every child: their drains at once, then the kill of any past the deadline."""
        children = [m.child for m in self.models.values() if m.child is not None]
        loads = [m.loading for m in self.models.values() if m.loading is not None]
        for task in loads:
            task.cancel()
        await asyncio.gather(*(c.stop(self.stop_timeout) for c in children), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
