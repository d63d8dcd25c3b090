"""A request's grammar read and compiled on the grammar worker (ServerState.grammars), within a time budget.

The event loop only waits: /health and every stream go on while a schema compiles
(grammar.compiled has why the worker's threads, and grammar.limits what they are let compile).
A compile still running at the budget's end is answered 400 `invalid_grammar` naming the field;
its thread finishes it and the result is dropped.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from ....grammar import GrammarWorker
from ....grammar.compiled import COMPILE_BUDGET_S
from ...http.errors import bad_request


async def compile_off_loop(worker: GrammarWorker, param: str, fn: Callable, *args, budget: float = COMPILE_BUDGET_S):
    """fn(*args) on the worker: its result, its exception, or a 400 naming `param` past `budget` seconds."""
    future = worker.submit(fn, *args)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), budget)
    except TimeoutError:
        future.cancel()  # one still queued never starts
        raise bad_request(f"{param}: compiling it took over {budget:g} s, the limit (COMPILE_BUDGET_S); give a "
                          "smaller schema or grammar", param, "invalid_grammar") from None
