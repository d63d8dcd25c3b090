"""llama-server's native POST /completion, for scripts written against llama.cpp.

Fields: prompt, n_predict (-1 or absent: until the context fills), temperature, top_k, top_p, min_p,
seed (-1: random, as in llama-server), stream, stop, ignore_eos, cache_prompt, grammar (GBNF),
json_schema, response_format (server/structured.py), samplers (where
they mean what this server does: see params._samplers), and speculation as llama-server spells it (`speculative.n_max`,
`speculative.n_min`, `speculative.p_min`) or as our `speculative` object. The answer
carries `content`, `tokens_predicted`, `tokens_evaluated`, `stop` and `timings`
(with `draft_n` and `draft_n_accepted`); `speculative_trace` too where `speculative.trace` asks.
Streams send one `data:` object per chunk, the last with `"stop": true`, and no `[DONE]`, as
llama-server does.
"""
from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .errors import bad_request
from .jobs import CLIENT_GONE, Job, start
from .openai_api import speculative_usage, sse_response, traced
from .params import KEY_SCOPE, GenRequest, check_unsupported, completion_prompt, get, read_json, \
    resolve_profile, sampling_params, spec_params
from .structured import finish_detail, refuse_constraints
from .tools import request_constraint

_LLAMA_SPEC_KEYS = {"speculative.n_max": "draft_max", "speculative.n_min": "draft_min",
                    "speculative.p_min": "draft_p_min"}


def timings(job: Job) -> dict:
    s = job.stats
    prompt_n = s.n_prompt - s.n_cached
    prompt_ms, predicted_ms = 1000 * s.t_prompt, 1000 * (s.t_total - s.t_prompt)
    return {
        "cache_n": s.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(1000 * prompt_n / prompt_ms, 2) if prompt_n and prompt_ms > 0 else 0.0,
        "predicted_n": s.n_generated,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / s.n_generated, 3) if s.n_generated else 0.0,
        "predicted_per_second": round(1000 * s.n_generated / predicted_ms, 2) if s.n_generated and predicted_ms > 0
        else 0.0,
        "draft_n": s.n_drafted,
        "draft_n_accepted": s.n_accepted,
        # under a grammar, json_schema or tools (a specserve extension): the grammar's share of predicted_ms
        **({"grammar_ms": round(1000 * s.t_grammar, 3)} if job.req.sampling.grammar is not None else {}),
    }


def final(job: Job, content: str, tokens: list[int]) -> dict:
    word = job.stats.stop_word if job.stats.finish_reason == "stop" else ""  # the one that cut the text
    stop_type = "limit" if job.stats.finish_reason == "length" else "word" if word else "eos"
    return {"content": content, "tokens": [], "stop": True, "model": job.req.model,
            "tokens_predicted": job.stats.n_generated, "tokens_evaluated": job.stats.n_prompt,
            "tokens_cached": job.stats.n_cached, "truncated": False, "stop_type": stop_type,
            "stopping_word": word, "id_slot": job.id_slot,
            "timings": timings(job), "speculative": speculative_usage(job),
            **finish_detail(job.stats)}


async def _request(request: Request) -> GenRequest:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req = llama_request(body, state, request)
    grammar, _ = await request_constraint(body, state, chat=False)  # grammar, json_schema, response_format
    if grammar is not None:
        req = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, grammar=grammar))
    return req


def llama_request(body: dict, state, request: Request, endpoint: str = "llama",
                  prompt: str | list[int] | None = None) -> GenRequest:
    """A /completion body (or what /infill leaves of one) -> GenRequest; `prompt` given: the body has none."""
    profile = resolve_profile(body, state.profiles, state.settings.model_name)
    check_unsupported(body, handled=("id_slot",))
    if endpoint != "llama":
        refuse_constraints(body, endpoint)
    spec_obj = get(body, "speculative", dict)
    flat = {field: body[key] for key, field in _LLAMA_SPEC_KEYS.items() if body.get(key) is not None}
    if flat and spec_obj is not None:
        raise bad_request("give either the speculative object or speculative.n_max/n_min/p_min, not both",
                          "speculative")
    spec, verify = spec_params(flat if spec_obj is None else spec_obj, profile, state.engine.draft is not None,
                               request.scope.get(KEY_SCOPE))
    sampling, limit = sampling_params(body, profile, state.engine.n_ctx, ("n_predict", "max_tokens"), random_seed=-1)
    return GenRequest(endpoint, profile.name, sampling, spec, verify, stream=get(body, "stream", bool, False),
                      prompt=completion_prompt(body) if prompt is None else prompt,
                      cache_prompt=get(body, "cache_prompt", bool, True), limit=limit,
                      id_slot=slot_id(body, len(state.scheduler.pool.slots)))


def slot_id(body: dict, n_slots: int) -> int:
    """llama-server's `id_slot`: -1 (any) or a slot of this server, or 400."""
    id_slot = get(body, "id_slot", int, -1)
    if not -1 <= id_slot < n_slots:
        raise bad_request(f"id_slot must be -1 or a slot of this server (0 to {n_slots - 1}), got {id_slot}", "id_slot")
    return id_slot


async def completion(request: Request) -> Response:
    req = await _request(request)
    job = await start(request.app.state.server, req, request)
    if req.stream:
        async def events(job: Job):
            tokens = []
            async for chunk in job.chunks():
                tokens.extend(chunk.tokens)
                yield traced({"content": chunk.text, "tokens": chunk.tokens, "stop": False}, job)
            yield final(job, "", tokens)
        return sse_response(request, job, events)
    out = await job.run_to_end(request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(traced(final(job, *out), job, whole=True))
