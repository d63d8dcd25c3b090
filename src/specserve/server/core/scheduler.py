"""Who runs when: one engine thread that batches the slots' steps, a pool of slots, a bounded queue.

Every engine call goes through one thread (batcher.py): each step it runs every active
request's passes together, one target pass holding all their tokens, so all streams
progress at once and none waits for another to finish.

Requests beyond the slots wait in a bounded FIFO queue; beyond that they are refused.
A slot being given back (its request ended, its cache not yet closed on the engine
thread) counts as free for that bound, so a client that drops a stream and at once
sends its next request is queued, not refused.

A slot's cached prompt belongs to the scope of the request that left it (its
cross_request_scope, which a scoped API key sets: a cache salt, as vLLM's `cache_salt`).
A request of another scope finds no prefix there: slot choice counts that cache as empty,
and the request empties it before its prompt runs (`claim`), so it never reuses, reports
or times another scope's prompt.
"""
from __future__ import annotations

import asyncio
import collections
from typing import Callable, Sequence

from ...engine import Engine
from ...slot import Slot
from ..http.errors import ApiError
from .batcher import SLOWDOWN, STALL, Batcher, Stepper


class QueueFull(Exception):
    """Every slot is busy and the queue is at its bound."""


def queue_full(pool: SlotPool) -> ApiError:
    return ApiError(503, f"all {len(pool.slots)} slots are busy and the queue is full ({pool.max_waiting}); "
                         "retry later", code="queue_full", headers={"Retry-After": "1"})


def draining() -> ApiError:
    return ApiError(503, "the server is shutting down", code="draining", headers={"Retry-After": "5"})


def stopping() -> ApiError:
    """What a request still running or queued when the drain's deadline passes gets."""
    return ApiError(503, "the server is shutting down and stopped this request at its drain deadline",
                    code="draining", headers={"Retry-After": "5"})


class SlotPool:
    """Free slots plus a FIFO of waiters, at most `max_waiting` of them. A waiter may want one slot
    (llama-server's `id_slot`); a released slot goes to the longest waiter that can take it. So no
    free slot is ever wanted by a waiter, and a request that finds a fitting free slot takes it."""

    def __init__(self, slots: Sequence[Slot], max_waiting: int):
        self.slots = list(slots)
        self.max_waiting = max_waiting
        self.releasing = 0  # slots whose request has ended, on their way back
        self._free = list(slots)
        self._scope = [""] * len(self.slots)  # the scope whose prompt each slot's cache holds
        self._waiters: collections.deque[tuple[asyncio.Future, int]] = collections.deque()  # (future, id_slot)

    @property
    def busy(self) -> int:
        return len(self.slots) - len(self._free)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No free slot and no room in the queue: a new request would be refused."""
        return not self._free and len(self._waiters) >= self.max_waiting + self.releasing

    def is_free(self, slot: Slot) -> bool:
        """Whether the slot is free now (no request holds it)."""
        return slot in self._free

    def available(self, id_slot: int = -1) -> bool:
        """A slot (slot `id_slot`, or any for -1) can be taken now, without waiting."""
        return any(self._fits(s, id_slot) for s in self._free)

    def _fits(self, slot: Slot, id_slot: int) -> bool:
        return id_slot < 0 or self.slots[id_slot] is slot

    def reusable(self, slot: Slot, tokens: Sequence[int], scope: str) -> int:
        """How many of `tokens` the slot's cache can give (its prefix, and runs that moved under
        --cache-reuse); 0 where the cache is another scope's."""
        if self._scope[self.slots.index(slot)] != scope:
            return 0
        return slot.reusable(tokens)

    def holds(self, i: int, scope: str) -> bool:
        """Whether slot i's cache is `scope`'s (the scope of the last request that ran on it)."""
        return self._scope[i] == scope

    def claim(self, slot: Slot, scope: str) -> bool:
        """Record that the slot's cache is now `scope`'s; True where it held another scope's prompt,
        which the caller must then empty before running anything."""
        i = self.slots.index(slot)
        stale = self._scope[i] != scope
        self._scope[i] = scope
        return stale

    async def acquire(self, tokens: Sequence[int], id_slot: int = -1, scope: str = "") -> Slot:
        """A free slot (slot `id_slot`; for -1 the one whose cache `tokens` can use most of, among
        caches of `scope`: `reusable`), or wait for one."""
        fitting = [s for s in self._free if self._fits(s, id_slot)]
        if fitting:
            best = max(fitting, key=lambda s: self.reusable(s, tokens, scope))
            self._free.remove(best)
            return best
        if len(self._waiters) >= self.max_waiting + self.releasing:
            raise QueueFull()
        fut = asyncio.get_running_loop().create_future()
        waiter = (fut, id_slot)
        self._waiters.append(waiter)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:  # handed a slot as we gave up
                self.release(fut.result())  # pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self, slot: Slot) -> None:
        """Give the slot to the longest waiter that can take it, or put it back. Event-loop thread only."""
        for waiter in list(self._waiters):
            fut, id_slot = waiter
            if fut.done():
                self._waiters.remove(waiter)
            elif self._fits(slot, id_slot):
                self._waiters.remove(waiter)
                fut.set_result(slot)
                return
        self._free.append(slot)

    def fail_waiters(self, make_error: Callable[[], Exception]) -> None:
        """Wake every waiter with its own `make_error()`: nobody will get a slot."""
        while self._waiters:
            fut, _ = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(make_error())


class Scheduler:
    """The engine thread, the slot pool, and the draining flag, for one server."""

    def __init__(self, engine: Engine, parallel: int, max_waiting: int, n_batch: int = 512,
                 on_pass: Callable[[int, int], None] | None = None, prefill_slowdown: float = SLOWDOWN,
                 prefill_stall: float = STALL):
        """on_pass is told the sequences and tokens of every target pass (metrics)."""
        if parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {parallel}")
        if max_waiting < 0:
            raise ValueError(f"--queue must be >= 0, got {max_waiting}")
        self.engine = engine
        self._shape = (parallel, max_waiting, n_batch, on_pass, prefill_slowdown, prefill_stall)
        self._load()
        self.draining = False  # refuse new requests; those in flight go on
        self.stopping = False  # the drain's deadline passed: requests in flight end at their next step
        self.closed = False
        self.loaded = True  # False while the server sleeps: no slots' caches, no engine thread (unload)
        self.active = 0  # requests accepted and not yet answered (drain waits for 0)

    def _load(self) -> None:
        parallel, max_waiting, n_batch, on_pass, prefill_slowdown, prefill_stall = self._shape
        slots = self.engine.new_slots(parallel, n_batch)
        self.pool = SlotPool(slots, max_waiting)
        targets = {s.target_group() for s in slots}  # one shared context, or each slot's own
        self.worker = Batcher(Stepper(targets, n_batch, on_pass, prefill_slowdown, prefill_stall))
        self.worker.submit(self.engine.calibrate)  # passes run on the engine thread alone (Engine.calibrate)

    def slot_bytes(self) -> int:
        """KV cache and compute buffers of one slot (target and draft contexts), as allocated at start."""
        return self.pool.slots[0].cache_bytes()

    @property
    def idle(self) -> bool:
        return self.active == 0

    def enter(self) -> None:
        self.active += 1

    def leave(self) -> None:
        self.active -= 1

    def stop_requests(self, make_error: Callable[[], Exception] = stopping) -> None:
        """End the drain: queued requests fail with `make_error()` now, running ones at their next step
        (Job.step raises `stopping()`). Event-loop thread only."""
        self.draining = self.stopping = True
        self.pool.fail_waiters(make_error)

    def unload(self) -> None:
        """Stop the engine thread and free the slots' caches, with no request in flight or queued (a
        sleeping server, core/sleep.py); the pool stays, its slots closed and free, for /health and /slots."""
        if self.loaded:
            self.loaded = False
            self.worker.shutdown()
            for slot in self.pool.slots:
                slot.close()

    def reload(self) -> None:
        """New slots (empty caches), pool and engine thread, as at start; the engine's models loaded first."""
        if not self.loaded and not self.closed:
            self._load()
            self.loaded = True

    def close(self) -> None:
        """Stop the engine thread (after its current step), then free the slots' caches. Idempotent."""
        if self.closed:
            return
        self.unload()
        self.closed = True
