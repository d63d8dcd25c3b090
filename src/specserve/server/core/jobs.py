"""One request's generation: prompt -> slot -> steps -> accounting.

`start` does everything that can fail with a client error before any byte of the
answer is sent (tokenize, check the context, wait for a slot, run the prompt and the
first step), so a streaming request still gets a proper 400 or 503; a client that
hangs up while it waits in the queue is dropped at once. `Job.finish` runs exactly
once however the request ends: it closes the slot's stream on the engine thread
(which stops generation at once), records metrics, logs the request's line and gives
the slot back. When a drain's deadline passes, the next step of every job raises
`stopping()` instead.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import AsyncIterator

import anyio
from starlette.requests import Request

from ...chat import ChatTemplateError
from ...config import SamplingParams
from ...processors import LogitRules, with_bias_text
from ...slot import Chunk
from ...logprobs import TokenLogprob
from ...prompt import chat_tokens
from ...stats import GenerationStats
from ..http.errors import ApiError, bad_request
from .constraints.tools import template_input
from .metrics import log_request
from .reasoning import Parting, resolve
from .request import GenRequest, exceed_context, fit_context
from .scheduler import QueueFull, SlotPool, draining, queue_full, stopping
from .server_parts import ServerParts
from .trace import Tracer

log = logging.getLogger("specserve.server")
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, the log and metrics do
DISCONNECT_CHECK_S = 0.25  # how often a non-streamed generation asks whether its client is still there
ADMIT_GRACE_S = 0.1  # how long a request that finds slots and queue full waits for a place before 503
RESEND_GRACE_S = 0.5  # how long a request waits for an ended request's slot that holds more of its prompt


def prompt_ids(model, req: GenRequest, template_kwargs: dict | None = None, n_ctx: int | None = None) -> list[int]:
    """Tokenize the prompt or render and tokenize the chat (`template_kwargs`: the server's variables for
    the chat template, under the request's own). Raises ApiError(400); with `n_ctx`, a chat whose messages
    alone cannot fit is refused before its rendering (which takes seconds for tens of thousands of them)."""
    if req.messages is not None:
        if n_ctx is not None and (least := _least_tokens(req.messages)) >= n_ctx:
            raise exceed_context(least, n_ctx, "messages")
        try:
            messages, tools = template_input(model, req.messages, req.tools)
            return chat_tokens(model, messages, tools, req.continue_final,
                               {**(template_kwargs or {}), **(req.template_kwargs or {})})
        except (ChatTemplateError, ValueError) as e:
            raise bad_request(str(e), "messages") from None
    if isinstance(req.prompt, str):
        # Raw prompts may spell control tokens (<|im_start|>), as llama-server and vLLM allow.
        return model.tokenize(req.prompt, add_special=True, parse_special=True)
    bad = [t for t in req.prompt if not 0 <= t < model.vocab.n_vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {model.vocab.n_vocab})", "prompt")
    return list(req.prompt)


def _least_tokens(messages) -> int:
    """A lower bound on a chat's prompt tokens: each user or tool message with text renders at least one (no
    template leaves out the user's words). Cheap: the messages are counted, not rendered."""
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") in ("user", "tool") and m.get("content"))


def _prepare(model, req: GenRequest, template_kwargs: dict | None, n_ctx: int) -> tuple[list[int], SamplingParams]:
    """Off the event loop: the prompt's tokens, and the sampling with its logit_bias text tokenized and
    checked against the vocabulary (400 `logit_bias` for a bias that leaves no token possible)."""
    tokens = prompt_ids(model, req, template_kwargs, n_ctx)
    try:
        sampling = with_bias_text(req.sampling, model)
        LogitRules.check(sampling, model.vocab.n_vocab)
    except ValueError as e:
        raise bad_request(str(e), "logit_bias") from None
    return tokens, sampling


class Job:
    """A running generation holding a slot. Drive it with `chunks()`; end it with `finish()`."""

    def __init__(self, state: ServerParts, req: GenRequest, slot, tokens: list[int], t_arrival: float, queue_s: float,
                 parting: Parting | None = None):
        self.state, self.req, self.slot = state, req, slot
        self.prompt_tokens = tokens
        self.parting = parting  # how the answer's reasoning block is parted from it (core/reasoning.py), if at all
        self.id_slot = state.scheduler.pool.slots.index(slot)  # which slot runs it (llama-server's id_slot)
        state.slot_records.started(self.id_slot, self)
        self.stats = GenerationStats()
        # the committed tokens' logprobs, where asked (SamplingParams.logprobs): gathered by collect()
        self.logprobs: list[TokenLogprob] | None = [] if req.sampling.logprobs is not None else None
        self.queue_s = queue_s
        self.t_arrival = t_arrival
        if req.warm:
            self._gen = slot.warm_steps(tokens, self.stats)
        else:
            self._gen = slot.generate_steps(tokens, req.sampling, req.spec, req.verify, stats=self.stats)
        self._run = None  # its handle on the batch scheduler, from the first step
        self._pending: list[Chunk] = []
        self._done = False
        self._finished = False
        self._closing = None  # the engine-thread future of finish()
        # who produced each token, when the request asks (speculative.trace): fed every chunk by chunks()
        self.tracer = (Tracer(state.engine.target.token_bytes, keep=not req.stream, skip=len(req.sampling.heal))
                       if req.spec.trace else None)

    @property
    def ending(self) -> bool:
        """Whether the request has ended (finish() called): its slot is on its way back."""
        return self._finished

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason or "stop"

    async def step(self) -> Chunk | None:
        """The next chunk, or None at the end; the first call puts the generation into the batch."""
        if self._pending:
            return self._pending.pop(0)
        if self._done or self._finished:
            return None
        if self.state.scheduler.stopping:
            raise stopping()
        if self._run is None:
            self._run = self.state.scheduler.worker.start(self._gen)
        chunk = await self._run.next()
        self._done = chunk is None
        if self._done and self.stats.grammar_error:
            raise dead_end(self.req, self.stats)
        return chunk

    async def chunks(self) -> AsyncIterator[Chunk]:
        while (chunk := await self.step()) is not None:
            if self.tracer is not None:
                self.tracer.feed(chunk)
            yield chunk

    async def collect(self, request: Request, until=None) -> tuple[str, list[int]] | None:
        """All the text and tokens, or None if the client went away (generation is then stopped);
        `until(chunk)` true: the answer ends with that chunk (answer.py: a repeated tool call).

        Whether the client is still there is asked at most every DISCONNECT_CHECK_S: the check costs
        the event loop time that llama.cpp's threads need (measured: docs/serving.md)."""
        parts, tokens = [], []
        next_check = time.monotonic() + DISCONNECT_CHECK_S
        async for chunk in self.chunks():
            parts.append(chunk.text)
            tokens.extend(chunk.tokens)
            if chunk.logprobs is not None and self.logprobs is not None:
                self.logprobs.extend(chunk.logprobs)
            if until is not None and until(chunk):
                break
            if time.monotonic() >= next_check:
                if await request.is_disconnected():
                    self.finish()
                    return None
                next_check = time.monotonic() + DISCONNECT_CHECK_S
        return "".join(parts), tokens

    async def run_to_end(self, request: Request, until=None) -> tuple[str, list[int]] | None:
        """Collect everything (or until `until`: collect), then finish and wait until the slot is back;
        None if the client left."""
        try:
            out = await self.collect(request, until)
        finally:
            self.finish()
        await self.finished()
        return out

    def finish(self) -> None:
        """Stop (if still running), account, log and free the slot. Idempotent."""
        if self._finished:
            return
        self._finished = True
        state, req, stats, queue_s = self.state, self.req, self.stats, self.queue_s

        def close_and_account() -> None:  # on the engine thread: never while a step runs
            try:
                if self._run is not None:
                    state.scheduler.worker.cancel(self._run)
                self._gen.close()
                state.metrics.observe(req.endpoint, stats, queue_s, time.perf_counter() - self.t_arrival,
                                      req.spec.cross_request_scope)
                state.slot_records.finished(self.id_slot, stats)
                log_request(req.endpoint, req.model, req.spec.mode, stats, queue_s)
            except Exception:
                log.exception("while closing a request")

        pool = state.scheduler.pool

        def release() -> None:  # back on the event loop
            pool.releasing -= 1
            pool.release(self.slot)
            state.scheduler.leave()

        loop = asyncio.get_running_loop()
        pool.releasing += 1
        try:
            self._closing = state.scheduler.worker.submit(close_and_account)
        except RuntimeError:  # the engine thread is gone (forced shutdown): nothing left to stop
            release()
            return
        self._closing.add_done_callback(lambda _: loop.call_soon_threadsafe(release))

    async def finished(self) -> None:
        """Finish, and wait until the request is accounted for and its slot is back."""
        self.finish()
        if self._closing is not None:
            await asyncio.wrap_future(self._closing)  # resumes after `release` (registered first)


async def _room_soon(pool, grace: float = ADMIT_GRACE_S) -> bool:
    """Whether a full pool makes room within `grace` seconds: a client that drops a stream and sends the
    next request at once can arrive before the server has seen the drop (its next write) and freed the slot."""
    deadline = time.perf_counter() + grace
    while pool.full and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    return not pool.full


def dead_end(req: GenRequest, stats: GenerationStats) -> ApiError:
    """What a request gets whose output constraint allowed no further token before its text was complete
    (a schema no finite text satisfies, a grammar past llguidance's limits at some step): an error, never
    a 200 carrying text the schema does not accept. A stream gets it as its last event, with no [DONE]."""
    param = getattr(req.sampling.grammar, "param", "grammar")
    return bad_request(f"{param}: the output constraint allowed no further token after {stats.n_generated} generated "
                       f"tokens, so no text valid under it can be given ({stats.grammar_error})", param,
                       "grammar_dead_end")


async def _disconnected(request: Request) -> None:
    """Return once the client has gone. Only after the body is read: later messages are disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _acquire(pool: SlotPool, tokens: list[int], request: Request | None, id_slot: int = -1, scope: str = ""):
    """A slot; while waiting for one, ApiError(CLIENT_GONE) as soon as the client hangs up,
    so that a client that gave up neither holds a queue place nor later runs its prompt."""
    if request is None or pool.available(id_slot):
        return await pool.acquire(tokens, id_slot, scope)
    acquire = asyncio.ensure_future(pool.acquire(tokens, id_slot, scope))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((acquire, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not acquire.done():
            acquire.cancel()  # gives up its queue place (or passes on a slot handed to it meanwhile)
        await asyncio.gather(acquire, gone, return_exceptions=True)
    if acquire.cancelled():
        raise ApiError(CLIENT_GONE, "the client closed the connection while the request waited for a slot",
                       code="client_gone")
    return acquire.result()


def _ending_with_more(state: ServerParts, tokens: list[int], scope: str) -> int:
    """The slot (-1: none) whose request has ended and which is on its way back, holding more of `tokens`
    than any free slot can give."""
    pool = state.scheduler.pool
    most = max((pool.reusable(s, tokens, scope) for s in pool.slots if pool.is_free(s)), default=0)
    found = -1
    for i, record in enumerate(state.slot_records.slots):
        job = record.job
        if job is None or not job.ending or pool.is_free(pool.slots[i]) or not pool.holds(i, scope):
            continue
        n = len(os.path.commonprefix([job.prompt_tokens, tokens]))
        if n > most:
            found, most = i, n
    return found


async def _own_cache_soon(state: ServerParts, tokens: list[int], request: Request | None, req: GenRequest):
    """A slot on its way back whose cache holds more of the prompt than any free one, if it is back within
    RESEND_GRACE_S; else None. A client that drops a stream and sends it again at once arrives while its
    slot is still being closed (on the engine thread, after the pass under way): without this it took
    another slot and evaluated its whole prompt again."""
    if req.id_slot >= 0 or not req.cache_prompt:
        return None
    i = _ending_with_more(state, tokens, req.spec.cross_request_scope)
    if i < 0:
        return None
    try:
        return await asyncio.wait_for(_acquire(state.scheduler.pool, tokens, request, i, req.spec.cross_request_scope),
                                      RESEND_GRACE_S)
    except (asyncio.TimeoutError, QueueFull):  # (a queue of 0 has no place to wait in)
        return None


async def start(state: ServerParts, req: GenRequest, request: Request | None = None) -> Job:
    """Validate the prompt, wait for a slot, run the prompt and first step. Raises ApiError.
    With `request`, a client that disconnects while queued is dropped (ApiError(CLIENT_GONE))."""
    t_arrival = time.perf_counter()
    scheduler, engine = state.scheduler, state.engine
    if scheduler.draining:
        raise draining()
    if scheduler.pool.full and not await _room_soon(scheduler.pool):  # refuse now rather than after tokenizing
        raise queue_full(scheduler.pool)
    scheduler.enter()  # from here the request counts as in flight: a drain waits for it
    try:
        tokens, sampling = await anyio.to_thread.run_sync(_prepare, engine.target, req, state.settings.template_kwargs,
                                                          engine.n_ctx)
        if sampling is not req.sampling:
            req = dataclasses.replace(req, sampling=sampling)
        if not tokens:
            raise bad_request("the prompt is empty after tokenization", "prompt")
        req = fit_context(req, len(tokens), engine.n_ctx)  # a prompt that leaves no room: 400
        req, parting = resolve(req, engine.target, tokens, state.settings.reasoning_format,
                               state.settings.reasoning_budget)
        t_queued = time.perf_counter()
        slot = await _own_cache_soon(state, tokens, request, req)
        if slot is None:
            slot = await _acquire(scheduler.pool, tokens, request, req.id_slot, req.spec.cross_request_scope)
    except QueueFull:
        scheduler.leave()
        raise queue_full(scheduler.pool) from None
    except BaseException:
        scheduler.leave()
        raise
    job = Job(state, req, slot, tokens, t_arrival, time.perf_counter() - t_queued, parting)
    try:
        # another scope's cache is forgotten as if cache_prompt were false (scheduler.SlotPool.claim)
        if scheduler.pool.claim(slot, req.spec.cross_request_scope) or not req.cache_prompt:
            await scheduler.worker.run(slot.forget_cache)
        first = await job.step()
    except ValueError as e:  # bad sampling/speculation values the checks above did not catch
        job.finish()
        raise bad_request(str(e)) from None
    except BaseException:
        job.finish()
        raise
    if first is not None:
        job._pending.append(first)
    return job
