"""Several completions for one request: OpenAI's `n`, llama-server's `n_cmpl` and its batches of prompts.

Each completion is its own job, all of them started at once (they take free slots, or queue). Sampled
completions differ: a seeded request's i-th completion has seed + i, so that the set reproduces, and
an unseeded one draws a seed of its own each time. Greedy completions are all the same text: it is
generated once and handed out n times.
"""
from __future__ import annotations

import asyncio
import dataclasses

from starlette.requests import Request

from ....config import SEED_LIMIT
from ...core.answer import Answer, answer
from ...core.jobs import Job, start
from ...core.request import GenRequest
from ...http.errors import bad_request
from ...state import ServerState


def count(n: int | None, n_slots: int, param: str = "n", stream: bool = False) -> int:
    """The number of completions asked for (1 when absent): 1 to the server's slots, as llama-server allows;
    one only where the answer is streamed."""
    if n is None:
        return 1
    if not 1 <= n <= n_slots:
        raise bad_request(f"{param} must be between 1 and the server's slots ({n_slots}), got {n}", param)
    if stream and n > 1:
        raise bad_request(f"{param} > 1 is not supported with stream", param, "unsupported_parameter")
    return n


def variants(req: GenRequest, n: int) -> list[GenRequest]:
    """The requests whose answers are the n completions; one for a greedy request (see the module docstring)."""
    if n == 1 or req.sampling.greedy:
        return [req]
    seed = req.sampling.seed
    return [dataclasses.replace(req, sampling=dataclasses.replace(
        req.sampling, seed=None if seed is None else (seed + i) % SEED_LIMIT)) for i in range(n)]


async def answers(state: ServerState, reqs: list[GenRequest], request: Request) -> list[tuple[Job, Answer]] | None:
    """Each request's job and whole answer, run at once; None if the client left. The first refusal is
    raised once every job has ended (none is left holding a slot)."""
    async def one(req: GenRequest):
        job = await start(state, req, request)
        return job, await answer(job, request)

    results = await asyncio.gather(*(one(r) for r in reqs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    if any(out is None for _, out in results):
        return None
    return results
