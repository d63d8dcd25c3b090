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
`n_cmpl` > 1 of a greedy request answers once (the completions would be identical).
"""
from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....fim import FimUnsupported, fim_tokens
from ....grammar.healing import vocab_of
from ...core.answer import answer, events
from ...core.events import Text
from ...core.jobs import CLIENT_GONE, start
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.guard import key_scope
from ..shared.answer import stream
from ..shared.builder import ServerView, build_request
from .answer import final
from .infill_rules import LineRules, select_fields
from .request import INFILL


def routes() -> list[Endpoint]:
    return [Endpoint("/infill", infill)]


def prepare(target) -> None:
    """At start-up, for a model with FIM tokens: read what the first completion would otherwise wait
    for (the FIM tokens, the token bytes that healing looks up: ~0.4 s for a 152k vocabulary)."""
    try:
        fim_tokens(target).require()
    except FimUnsupported:
        return
    vocab_of(target)


async def infill(request: Request) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, own = await build_request(INFILL, body, ServerView.of(state, key_scope(request.scope)))
    t_start = time.perf_counter()
    job = await start(state, req, request)
    # the time rule counts from the end of the prompt, as llama-server's t_start_generation
    rules = LineRules(own.n_indent or 0, own.t_max_predict_ms or 0, t_start + job.queue_s + job.stats.t_prompt)
    fields = own.response_fields

    def shaped(content: str) -> dict:
        out = final(job, content, [])
        if rules.stopped:
            out["stop_type"] = "limit"
        return select_fields(out, fields) if fields else out

    if req.stream:
        async def chunks():
            async for event in events(job, cut=rules):
                if event.__class__ is Text:
                    yield {"content": event.text, "tokens": event.tokens, "stop": False}
            await job.finished()
            yield shaped("")
        return stream(request, job, chunks())
    out = await answer(job, request, cut=rules)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(shaped(out.text))
