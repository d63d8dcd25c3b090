"""llama-server's POST /infill, as llama.vim and llama.vscode call it (the body: protocol.InfillRequest; its
declaration: request.INFILL).

The body: `input_prefix`, `input_suffix`, `input_extra` ([{"filename", "text"}]), `prompt` (the
current line up to the cursor), `n_indent`, `t_max_predict_ms`, `t_max_prompt_ms` (accepted; not
applied, as in llama-server), `id_slot`, `n_cmpl`, `response_fields`, and every /completion field.
The prompt is laid out with the model's own FIM tokens (fim.py); a model without them gets 400
`infill_not_supported` naming the missing token. `n_predict: 0` warms the slot's caches (target
and draft model) and generates nothing.

Where the editors' bodies ask for what this server does differently, it says so in docs/infill.md:
llama.cpp's `infill` sampler (in both editors' `samplers`) is served as greedy decoding, the
target's most likely token each step; `id_slot` runs the request on that slot (waiting for it
while busy), as llama-server does; -1 takes the free slot whose cache shares the longest prefix;
`n_cmpl` > 1 answers an array of that many completions, as llama-server does (llama.vscode asks for 3):
sampled ones run at once on as many slots (n_completions.py; at most the server's slots), a greedy request's
are one generation handed out n times (they would be identical), at most request.MAX_GREEDY_COPIES
(the count is checked by the builder: request.check_infill).
"""
from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....fim import FimUnsupported, fim_tokens
from ....grammar.healing import vocab_of
from ...core.answer import answer, events
from ...core.events import Text
from ...core.jobs import CLIENT_GONE, Job, start
from ...core.request import GenRequest
from ...http.endpoint import Endpoint
from ...state import ServerState
from ..shared import n_completions
from ..shared.answer import stream
from ..shared.builder import request_of
from .answer import final
from .infill_rules import LineRules, select_fields
from .protocol import InfillRequest
from .request import INFILL


def routes() -> list[Endpoint]:
    return [Endpoint("/infill", infill)]


def warm(target) -> None:
    """Beside the first requests, for a model with FIM tokens: read what the first completion would otherwise
    wait for (the FIM tokens, the token bytes that healing looks up: ~0.4-0.9 s for a 152k vocabulary)."""
    try:
        fim_tokens(target).require()
    except FimUnsupported:
        return
    vocab_of(target)


async def infill(request: Request) -> Response:
    state, req, own = await request_of(INFILL, request)
    n = own.n_cmpl or 1
    if n > 1:
        return await _several(request, state, req, own, n)
    job, rules = await _start(request, state, req, own)

    if req.stream:
        async def chunks():
            async for event in events(job, cut=rules):
                if event.__class__ is Text:
                    yield {"content": event.text, "tokens": event.tokens, "stop": False}
            await job.finished()
            yield _shaped(job, rules, "", own)
        return stream(request, job, chunks())
    out = await answer(job, request, cut=rules)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(_shaped(job, rules, out.text, own))


async def _start(request: Request, state: ServerState, req: GenRequest, own: InfillRequest) -> tuple[Job, LineRules]:
    t_start = time.perf_counter()
    job = await start(state, req, request)
    # the time rule counts from the end of the prompt, as llama-server's t_start_generation
    return job, LineRules(own.n_indent or 0, own.t_max_predict_ms or 0, t_start + job.queue_s + job.stats.t_prompt)


def _shaped(job: Job, rules: LineRules, content: str, own: InfillRequest, index: int = 0) -> dict:
    out = {**final(job, content, []), "index": index}
    if rules.stopped:
        out["stop_type"] = "limit"
    return select_fields(out, own.response_fields) if own.response_fields else out


async def _several(request: Request, state: ServerState, req: GenRequest, own: InfillRequest, n: int) -> Response:
    """n_cmpl > 1: an array of n completions, each under its own line rules (n_completions.variants: one run for a
    greedy request). The first refusal is raised once every run has ended."""
    async def one(run: GenRequest):
        job, rules = await _start(request, state, run, own)
        out = await answer(job, request, cut=rules)
        return job, rules, None if out is None else out.text

    results = await asyncio.gather(*(one(r) for r in n_completions.variants(req, n)), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    if any(content is None for _, _, content in results):
        return Response(status_code=CLIENT_GONE)
    picked = [results[i % len(results)] for i in range(n)]
    return JSONResponse([_shaped(job, rules, content, own, i) for i, (job, rules, content) in enumerate(picked)])
