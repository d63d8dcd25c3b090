"""The batch scheduler: every active slot's step in shared forward passes, on one engine thread.

Each request is its slot's step generator (Slot.generate_steps), which yields the passes it
needs (steps.Eval) and its chunks. A step of the scheduler, like llama-server's:

1. draft: while any slot waits on a draft-model pass, run one draft pass holding every such
   slot's tokens (one pass per drafting position across slots);
2. verify: one target pass holding every slot's last token plus its draft (plain decoding
   is a draft of none) and, with the room left, chunks of prompts being processed;
3. each slot is sent its rows of logits, verifies and commits on its own (the per-slot code
   is the single-sequence code) and runs on to its next pass.

A pass holds at most n_batch tokens (--batch-size): verifications first, whole, then
prompt chunks, so a long prompt is spread over steps instead of stalling every stream. While
streams are running, a pass's prompt chunk is also cut so that the pass is expected to take
at most `slowdown` times what the streams' tokens alone take (--prefill-slowdown, from the
measured cost of passes by size): a 2,000-token prompt then slows the streams beside it by at
most that factor, and is itself processed at what that leaves (at least MIN_CHUNK tokens a
pass). With no stream running a prompt takes whole n_batch chunks.
A failure stays in its slot: a pass that fails is retried one slot at a time, and a slot
whose generator raises ends with that error while the others go on.

What the chunking measured, and what was tried and not kept: docs/serving.md.

Forward passes are serialised: two llama.cpp decodes at once (each spinning its own
threads) slow each other down by ~100x on a small CPU. Other engine calls (closing a
request, emptying a cache) are submitted to the same thread and run between steps.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

from ...batchcost import BatchCost
from ...steps import Eval, Steps

log = logging.getLogger("specserve.server")


MIN_CHUNK = 4  # prompt tokens a pass beside running streams holds at least, whatever it costs
SLOWDOWN = 2.0  # default: a pass with a prompt chunk costs at most this x the streams' tokens alone...
STALL = 2.0  # ...or this many seconds, whichever is more (--prefill-stall)


def _always() -> bool:
    return True


class Run:
    """One generation on the scheduler: its generator, where its output goes, the pass it waits on."""

    __slots__ = ("gen", "emit", "op", "ready")

    def __init__(self, gen: Steps, emit: Callable, ready: Callable[[], bool] = _always):
        self.gen = gen
        self.emit = emit  # called with each Chunk, then None at the end or the exception that ended it
        self.op: Eval | None = None
        self.ready = ready  # False while its reader is behind: it sits out the steps until it catches up


class Stepper:
    """The synchronous core: `add` generations, call `step` while `runs` is not empty."""

    def __init__(self, target_groups, n_batch: int, on_pass: Callable[[int, int], None] | None = None,
                 slowdown: float = SLOWDOWN, stall: float = STALL):
        self.targets = {id(g) for g in target_groups}  # the target's context(s): their pass comes last in a step
        self.n_batch = n_batch
        self.slowdown = slowdown  # 0: prompt chunks fill the pass whatever the streams beside them
        self.stall = stall  # seconds a pass with prompt chunks may take beside streams, if more than slowdown x theirs
        self.on_pass = on_pass  # told (sequences, tokens) of every target pass
        self.runs: list[Run] = []
        self.costs: dict[int, BatchCost] = {}  # id(group) -> what its passes cost by size

    def add(self, gen: Steps, emit: Callable, ready: Callable[[], bool] = _always) -> Run:
        run = Run(gen, emit, ready)
        self.runs.append(run)
        return run

    def cancel(self, run: Run) -> None:
        """Stop a generation now (between steps): its generator is closed, nothing more is emitted."""
        if run in self.runs:
            self.runs.remove(run)
            run.gen.close()

    @property
    def ready(self) -> bool:
        """Whether a step would do anything: some run's reader has caught up."""
        return any(r.ready() for r in self.runs)

    def step(self) -> None:
        runs = [r for r in self.runs if r.ready()]
        if len(self.runs) == 1 and runs and runs[0].op is not None and not runs[0].op.split:
            run = runs[0]  # one slot decoding: its pass, as a single stream runs it, and nothing else
            target = id(run.op.group) in self.targets
            self._run_alone(run, target)
            return
        for run in [r for r in runs if r.op is None]:  # new: run to its first pass
            self._advance(run, None)
        first = True
        while True:  # draft passes, one per drafting position; a prompt chunk only in the first
            drafting = [r for r in runs if r.op is not None and id(r.op.group) not in self.targets
                        and (first or not r.op.split)]
            if not drafting:
                break
            self._passes(drafting)
            first = False
        verifying = [r for r in runs if r.op is not None and id(r.op.group) in self.targets]
        if verifying:
            self._passes(verifying)

    def _passes(self, runs: list[Run]) -> None:
        """One pass per context among these runs' waiting Evals."""
        groups: dict[int, tuple[object, list[Run]]] = {}
        for r in runs:
            g = r.op.group
            groups.setdefault(id(g), (g, []))[1].append(r)
        for g, rs in groups.values():
            if rs[0].op.ctx.shared is not None:  # sequences of a shared context: one batch
                self._decode(g, rs)
            else:  # a context of its own: its one sequence alone
                for r in rs:
                    self._run_alone(r, id(g) in self.targets)

    def _run_alone(self, run: Run, target: bool = False) -> None:
        try:
            out = run.op.run()
        except Exception as e:
            self._end(run, e)
            return
        if target and self.on_pass is not None:
            self.on_pass(1, len(run.op.tokens))
        self._advance(run, out)

    def _decode(self, group, runs: list[Run]) -> None:
        """One batch of these runs' tokens on a shared context, within n_batch; the rest wait."""
        budget = min(self.n_batch, group.n_batch)
        cost = self.costs.setdefault(id(group), BatchCost())
        taken: list[tuple[Run, int]] = []
        used, chunked = 0, False
        for r in sorted(runs, key=lambda r: r.op.split):  # whole passes (verification) before prompt chunks
            n = len(r.op.tokens)
            if r.op.split and not chunked:
                chunked = True
                if used and self.slowdown > 0:  # streams run in this pass: cut the chunks to what they bear
                    limit = max(self.slowdown * cost.cost(used), self.stall)
                    budget = min(budget, cost.most_tokens(limit, used + MIN_CHUNK, budget))
            if n > budget and not r.op.split:
                self._end(r, ValueError(f"a pass of {n} tokens does not fit --batch-size {budget}"))
            elif used + n <= budget:
                taken.append((r, n))
                used += n
            elif r.op.split and used < budget:
                taken.append((r, budget - used))
                used = budget
        if not taken:
            return
        parts = [(r.op.ctx, r.op.tokens[:n] if n < len(r.op.tokens) else r.op.tokens,
                  r.op.logits if n == len(r.op.tokens) else None) for r, n in taken]
        t = time.perf_counter()
        try:
            outs = group.decode(parts)
        except Exception as e:
            if len(taken) == 1:
                self._end(taken[0][0], e)
            else:  # find whose it is: one at a time, so that one slot's failure stays its own
                for r, _ in taken:
                    self._decode(group, [r])
            return
        t = time.perf_counter() - t
        cost.add(used, t)
        if id(group) in self.targets and self.on_pass is not None:
            self.on_pass(len(taken), used)
        copy = len(taken) > 1 and not group.can_rollback  # a recurrent truncate re-evaluates: keep our rows
        for (r, n), out in zip(taken, outs):
            r.op.seconds = cost.charge(used, n, t)
            if n < len(r.op.tokens):
                self._advance(r, n)  # a prompt chunk: told how many tokens were taken
            else:
                self._advance(r, out.copy() if copy and out is not None else out)

    def _advance(self, run: Run, value) -> None:
        """Send `value` and run the generation on to its next pass, emitting its chunks."""
        while True:
            try:
                item = run.gen.send(value)
            except StopIteration:
                self._end(run, None)
                return
            except Exception as e:
                self._end(run, e)
                return
            if type(item) is Eval:
                run.op = item
                return
            run.emit(item)
            value = None

    def _end(self, run: Run, error: Exception | None) -> None:
        if run in self.runs:
            self.runs.remove(run)
        run.op = None
        run.gen.close()
        run.emit(error)


class RunHandle:
    """The event loop's side of a Run: await its chunks with `next()`.

    A generation runs at most AHEAD chunks ahead of its reader (the engine computes the next
    step while the server sends the last), so a slow or vanished client does not make the
    engine generate text nobody reads, and the event loop is not flooded."""

    AHEAD = 2

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]):
        self._loop = loop
        self._wake = wake
        self._queue: asyncio.Queue = asyncio.Queue()
        self._delivered = 0  # written by the engine thread only
        self._read = 0  # written by the event loop only
        self.run: Run | None = None

    def ready(self) -> bool:
        return self._delivered - self._read < self.AHEAD

    def deliver(self, item) -> None:
        """From the engine thread: a Chunk, None (the end) or an exception."""
        self._delivered += 1
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening
            pass

    async def next(self):
        """The next Chunk, None at the end; raises what ended the generation."""
        item = await self._queue.get()
        self._read += 1
        self._wake()  # the engine may be waiting for this reader
        if item is None or isinstance(item, BaseException):
            self._queue.put_nowait(item)  # the end stays the answer to every later call
            if item is not None:
                raise item
        return item


class Batcher:
    """The one thread that touches the models: submitted calls between steps, steps while runs are active."""

    def __init__(self, stepper: Stepper):
        self.stepper = stepper
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="specserve-engine", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable, *args) -> Future:
        if self._stop:
            raise RuntimeError("the engine thread has stopped")
        fut: Future = Future()
        self._calls.put((fut, fn, args))
        return fut

    async def run(self, fn: Callable, *args):
        """Run fn(*args) on the engine thread, between steps, and return its result."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def start(self, gen: Steps) -> RunHandle:
        """Add a generation to the batch (from the event loop); its chunks come through the handle."""
        handle = RunHandle(asyncio.get_running_loop(), self._wake)
        self.submit(self._add, gen, handle)
        return handle

    def _wake(self) -> None:
        self._calls.put(None)

    def cancel(self, handle: RunHandle) -> None:
        """On the engine thread: stop the handle's generation."""
        if handle.run is not None:
            self.stepper.cancel(handle.run)

    def _add(self, gen: Steps, handle: RunHandle) -> None:
        handle.run = self.stepper.add(gen, handle.deliver, handle.ready)

    def _loop(self) -> None:
        while not self._stop:
            self._run_calls(block=not self.stepper.ready)
            if self.stepper.ready and not self._stop:
                try:
                    self.stepper.step()
                except Exception as e:  # a bug in the scheduler itself: end every run rather than hang them
                    log.exception("batch step failed")
                    for run in list(self.stepper.runs):
                        self.stepper._end(run, e)

    def _run_calls(self, block: bool) -> None:
        while True:
            try:
                call = self._calls.get(block=block)
            except queue.Empty:
                return
            block = False
            if call is None:  # a wake-up (shutdown, or a reader caught up): the calls behind it run now too
                continue
            fut, fn, args = call
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:
                    fut.set_exception(e)

    def shutdown(self) -> None:
        """Wait for the step in progress; drop the queued calls; end the runs still active."""
        self._stop = True
        self._calls.put(None)
        self._thread.join()
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        for run in list(self.stepper.runs):
            self.stepper._end(run, RuntimeError("the server stopped"))
