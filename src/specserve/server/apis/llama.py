"""llama-server's native POST /completion, for scripts written against llama.cpp.

Fields: prompt, n_predict (-1 or absent: until the context fills), temperature, top_k, top_p, min_p,
seed (-1: random, as in llama-server), stream, stop, ignore_eos, cache_prompt, id_slot, grammar (GBNF),
json_schema, response_format (constraint_fields.py), samplers (where they mean what this server does:
core/params.py), and speculation as llama-server spells it (`speculative.n_max`, `speculative.n_min`,
`speculative.p_min`) or as our `speculative` object. The answer carries `content`, `tokens_predicted`,
`tokens_evaluated`, `stop` and `timings` (with `draft_n` and `draft_n_accepted`); `speculative_trace`
too where `speculative.trace` asks. Streams send one `data:` object per chunk, the last with
`"stop": true`, and no `[DONE]`, as llama-server does.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..core.answer import answer, events, finish_detail, speculative_usage
from ..core.events import Text
from ..core.jobs import CLIENT_GONE, Job, start
from ..core.params import Limit
from ..core.request import GenRequest
from ..http.body import read_json
from ..http.endpoint import Endpoint
from ..http.errors import bad_request
from .constraint_fields import output_grammar, refuse_constraints, refuse_tools
from .fields import Generation, check_unsupported, first_limit, params_of, prompt_value, required, resolve_profile
from .openai_common import key_scope, stream, traced
from .validation import parse


class LlamaRequest(Generation):
    prompt: Any = None  # a string or token ids: fields.prompt_value
    n_predict: int | None = None
    max_tokens: int | None = None
    id_slot: int | None = None
    # llama-server's flat spelling of speculation (llama-server's n_max is our draft_max)
    n_max: int | None = Field(None, alias="speculative.n_max")
    n_min: int | None = Field(None, alias="speculative.n_min")
    p_min: float | None = Field(None, alias="speculative.p_min")

    def spec_asked(self) -> dict:
        """The speculative fields asked for, in either spelling (not both)."""
        flat = {field: v for field, v in (("draft_max", self.n_max), ("draft_min", self.n_min),
                                          ("draft_p_min", self.p_min)) if v is not None}
        if flat and self.speculative is not None:
            raise bad_request("give either the speculative object or speculative.n_max/n_min/p_min, not both",
                              "speculative")
        return flat if self.speculative is None else self.speculative.asked()


def routes() -> list[Endpoint]:
    return [Endpoint("/completion", completion)]


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


def llama_request(body: dict, state, scope: str | None, endpoint: str = "llama",
                  prompt: str | list[int] | None = None) -> tuple[GenRequest, LlamaRequest]:
    """A /completion body (or what /infill leaves of one) -> GenRequest, without its output constraint,
    and the body's fields; `prompt` given: the body has none. `scope`: the API key's cross-request scope."""
    fields = parse(LlamaRequest, body)
    profile = resolve_profile(fields.model, state.profiles, state.settings.model_name)
    check_unsupported(body, handled=("id_slot",))
    if endpoint != "llama":
        refuse_constraints(body, fields, endpoint)
    limit = first_limit(fields, ("n_predict", "max_tokens"))
    if limit is not None and limit.field == "n_predict" and limit.n == -1:  # llama-server: -1 = no limit
        limit = Limit("n_predict", None)
    sampling, described, spec, verify = params_of(state, fields, profile, scope, limit, random_seed=-1,
                                                  spec=fields.spec_asked())
    if prompt is None:
        prompt = required(prompt_value(fields.prompt), "prompt")
    req = GenRequest(endpoint, profile.name, sampling, spec, verify, stream=bool(fields.stream), prompt=prompt,
                     cache_prompt=fields.cache_prompt is not False, limit=described,
                     id_slot=slot_id(fields.id_slot, len(state.scheduler.pool.slots)))
    return req, fields


def slot_id(id_slot: int | None, n_slots: int) -> int:
    """llama-server's `id_slot`: -1 (any) or a slot of this server, or 400."""
    id_slot = -1 if id_slot is None else id_slot
    if not -1 <= id_slot < n_slots:
        raise bad_request(f"id_slot must be -1 or a slot of this server (0 to {n_slots - 1}), got {id_slot}", "id_slot")
    return id_slot


async def completion(request: Request) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, fields = llama_request(body, state, key_scope(request))
    refuse_tools(body)
    grammar = await output_grammar(state, fields)  # grammar, json_schema, response_format
    if grammar is not None:
        req = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, grammar=grammar))
    job = await start(state, req, request)
    if req.stream:
        return stream(request, job, _chunks(job))
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(traced(final(job, out.text, out.tokens), out.trace))


async def _chunks(job: Job):
    async for event in events(job):
        if event.__class__ is Text:
            yield traced({"content": event.text, "tokens": event.tokens, "stop": False}, event.trace)
    yield final(job, "", [])
