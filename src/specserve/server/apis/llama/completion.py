"""llama-server's native POST /completion (and /completions), for scripts written against llama.cpp.

The body (protocol.LlamaRequest; its declaration: request.LLAMA) has these fields: prompt (a string,
token ids, both mixed in one array, `{"prompt_string": ...}`, or an array of such prompts: then the
answer is an array), n_predict (-1 or absent: until the context fills),
temperature, top_k, top_p, min_p, seed (-1: random, as in llama-server), stream, stop, ignore_eos,
cache_prompt, id_slot, n_cmpl (or n), return_tokens, response_fields, timings_per_token, grammar (GBNF),
json_schema, response_format (shared/constraint_fields.py), samplers (where they mean what this server does:
core/params.py), and speculation as llama-server spells it (`speculative.n_max`, `speculative.n_min`,
`speculative.p_min`) or as our `speculative` object. The answer carries llama-server's fields
(`content`, `tokens`, `generation_settings`, `prompt`, `tokens_predicted`, `tokens_evaluated`,
`truncated`: the context filled, `stop_type`, `timings` with `draft_n` and `draft_n_accepted`);
`speculative_trace` too where `speculative.trace` asks. Streams send one `data:` object per chunk, the
last with `"stop": true`, and no `[DONE]`, as llama-server does.
"""
from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.answer import answer, events
from ...core.events import Text
from ...core.jobs import CLIENT_GONE, Job, start
from ...core.request import GenRequest
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...state import ServerState
from ..shared import n_completions
from ..shared.answer import stream, traced
from ..shared.builder import request_of
from ..shared.logprob_shapes import llama_probs, per_token
from ..shared.prompt_progress import progress_events
from ..shared.timings import timings
from .answer import final
from .infill_rules import select_fields
from .protocol import LlamaRequest
from .request import LLAMA


def routes() -> list[Endpoint]:
    return [Endpoint(path, completion) for path in ("/completion", "/completions")]  # /completions: not OpenAI's


async def completion(request: Request) -> Response:
    state, req, fields = await request_of(LLAMA, request)
    n = n_completions.count(fields.n_cmpl if fields.n_cmpl is not None else fields.n, state.n_slots,
                      "n_cmpl" if fields.n_cmpl is not None else "n")
    reqs = [dataclasses.replace(req, prompt=p) for p in fields.prompts]
    if len(reqs) == 1 and n == 1:
        return await _one(request, state, req, fields)
    if req.stream:
        raise bad_request("stream with several prompts or completions is not supported", "stream",
                          "unsupported_parameter")
    runs = [v for r in reqs for v in n_completions.variants(r, n)]
    outs = await n_completions.answers(state, runs, request)
    if outs is None:
        return Response(status_code=CLIENT_GONE)
    per = len(runs) // len(reqs)  # 1 where a greedy request's n completions are one answer
    answers = [_shaped(job, out, fields, i) for i, (job, out) in enumerate(outs) for _ in range(n // per)]
    return JSONResponse([{**a, "index": i} for i, a in enumerate(answers)])


def _shaped(job: Job, out, fields: LlamaRequest, index: int = 0) -> dict:
    body = traced(final(job, out.text, out.tokens, bool(fields.return_tokens)), out.trace)
    if out.logprobs:
        body["completion_probabilities"] = llama_probs(job.state.engine.target, out.logprobs,
                                                       bool(fields.post_sampling_probs))
    return select_fields(body, fields.response_fields) if fields.response_fields else body


async def _one(request: Request, state: ServerState, req: GenRequest, fields: LlamaRequest) -> Response:
    job = await start(state, req, request)
    if req.stream:
        return stream(request, job, _chunks(job, fields))
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(_shaped(job, out, fields))


async def _chunks(job: Job, fields: LlamaRequest):
    new_line = False
    if fields.return_progress:
        for progress, times in progress_events(job):
            yield {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": job.id_slot,
                   "tokens_predicted": 0, "tokens_evaluated": job.stats.n_prompt, "prompt_progress": progress,
                   **({"timings": times} if fields.timings_per_token else {})}
    model = job.state.engine.target
    async for event in events(job):
        if event.__class__ is Text:
            new_line = new_line or "\n" in event.text
            pieces = per_token(model, event)
            for i, (text, tokens, rows) in enumerate(pieces):
                chunk = {"index": 0, "content": text, "tokens": tokens, "stop": False,
                         "id_slot": job.id_slot, "tokens_predicted": job.stats.n_generated,
                         "tokens_evaluated": job.stats.n_prompt}
                if rows:
                    chunk["completion_probabilities"] = llama_probs(model, rows, bool(fields.post_sampling_probs))
                if fields.timings_per_token:
                    chunk["timings"] = timings(job)
                yield traced(chunk, event.trace if i == len(pieces) - 1 else None)  # the step's trace once
    await job.finished()
    yield final(job, "", [], new_line=new_line)
