"""A grammar compiled once, off the event loop and off the engine thread, and handed to the engine.

`compile_grammar` builds llguidance's matcher for the target's vocabulary (under llguidance's
own ParserLimits, its defaults: lexer fuel, grammar size), and computes the first token mask: a
grammar that allows no first token (`{"$ref": "#"}`, a `$ref` cycle) or that passes a limit at its
first step is refused here, before any generation. The result is a CompiledGrammar: the grammar text
(a `str`, so SamplingParams carries it as any grammar) holding the matcher, which the engine's
`for_request` copies (`deep_copy`, about a microsecond) instead of compiling again.

GrammarWorker runs compiles on threads of their own with a large stack (limits.STACK_BYTES):
llguidance recurses on the native stack and releases the GIL while it compiles, so a compile
neither overflows the 8 MiB of a default thread on what the limits let through nor holds the
event loop. A compile past its time budget is answered as refused; its thread finishes it
(the limits bound how long) and the result is dropped.
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Callable

import llguidance
import llguidance.numpy as llg_np

from .limits import STACK_BYTES, GrammarError
from .sources import reason

COMPILE_BUDGET_S = 10.0  # the most a request waits for its grammar to compile


class CompiledGrammar(str):
    """A grammar's text with its matcher compiled for one vocabulary, at its start state.
    `param`: the request field it came from (for the error that names it)."""

    matcher_at_start: llguidance.LLMatcher
    param: str

    def __new__(cls, grammar: str, matcher: llguidance.LLMatcher, param: str = "grammar", seconds: float = 0.0):
        self = super().__new__(cls, grammar)
        self.matcher_at_start, self.param, self.seconds = matcher, param, seconds
        return self

    def matcher(self) -> llguidance.LLMatcher:
        """A matcher of its own at the start state (a copy: the compiled one is never advanced)."""
        return self.matcher_at_start.deep_copy()


def compile_grammar(grammar: str, tokenizer: llguidance.LLTokenizer, what: str = "grammar",
                    param: str = "grammar") -> CompiledGrammar:
    """The grammar compiled for `tokenizer`'s vocabulary, or GrammarError saying why it cannot
    constrain generation (invalid, past a limit, or allowing no first token)."""
    t = time.perf_counter()
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"invalid {what}: {reason(matcher.get_error())}")
    bits = llg_np.allocate_token_bitmask(1, tokenizer.vocab_size)
    llg_np.fill_next_token_bitmask(matcher, bits, 0)  # the first step: the same work as the first mask
    if matcher.is_error():
        raise GrammarError(f"{what} allows no output: {reason(matcher.get_error(), first_line=True)}")
    if matcher.is_stopped() and not matcher.is_accepting():
        raise GrammarError(f"{what} allows no output (no first token, and the empty text does not match it)")
    return CompiledGrammar(grammar, matcher, param, time.perf_counter() - t)


class GrammarWorker:
    """Threads with STACK_BYTES of stack that run compiles, `threads` at once; the rest wait in order."""

    def __init__(self, threads: int = 2, stack_bytes: int = STACK_BYTES):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._n, self._stack = threads, stack_bytes
        self._lock = threading.Lock()
        self._unfinished = 0  # submitted and not yet done, a compile its request gave up on included

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        """Run fn(*args) on a worker thread; its result or exception comes back in the future."""
        self._start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._unfinished += 1
        self._jobs.put((future, fn, args))
        return future

    @property
    def busy(self) -> bool:
        """Whether a compile is queued or running (a sleeping server must not free the vocabulary under it)."""
        return self._unfinished > 0

    def close(self) -> None:
        """Stop the threads once the compiles queued now are done (they are daemons: exit never waits)."""
        for _ in self._threads:
            self._jobs.put(None)

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            old = threading.stack_size(self._stack)  # applies to threads started until it is set back
            try:
                for i in range(self._n):
                    thread = threading.Thread(target=self._run, name=f"grammar-{i}", daemon=True)
                    thread.start()
                    self._threads.append(thread)
            finally:
                threading.stack_size(old)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            try:
                if not future.set_running_or_notify_cancel():
                    continue  # given up on before it started
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed to the waiting request
                    future.set_exception(e)
            finally:
                with self._lock:
                    self._unfinished -= 1
