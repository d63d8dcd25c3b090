"""OpenAI's POST /v1/completions (with `suffix`: fill in the middle, laid out as /infill) and GET /v1/models."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..core.answer import answer, events
from ..core.events import Text
from ..core.jobs import Job, start
from ..core.params import Limit
from ..core.request import GenRequest
from ..http.body import read_json
from ..http.endpoint import Endpoint
from .constraint_fields import output_grammar, refuse_tools
from .fields import check_unsupported, first_limit, params_of, prompt_value, required, resolve_profile
from .infill_rules import openai_fim_prompt
from .openai_common import OpenAIGeneration, head, key_scope, respond, stream, stream_end, traced
from .validation import parse

DEFAULT_MAX_TOKENS = Limit("max_tokens", 16)  # /v1/completions without max_tokens: OpenAI's default


class CompletionRequest(OpenAIGeneration):
    prompt: Any = None  # a string or token ids: fields.prompt_value
    suffix: str | None = None
    max_tokens: int | None = None


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/completions", completions), Endpoint("/v1/models", models, ("GET",))]


async def completion_request(request: Request) -> tuple[GenRequest, CompletionRequest]:
    """The body as a GenRequest (and its fields, for what shapes the answer)."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    fields = parse(CompletionRequest, body)
    profile = resolve_profile(fields.model, state.profiles, state.settings.model_name)
    check_unsupported(body, handled=("suffix",))
    sampling, limit, spec, verify = params_of(state, fields, profile, key_scope(request),
                                              first_limit(fields, ("max_tokens",)), default=DEFAULT_MAX_TOKENS)
    refuse_tools(body)
    grammar = await output_grammar(state, fields)
    if grammar is not None:
        sampling = dataclasses.replace(sampling, grammar=grammar)
    prompt = required(prompt_value(fields.prompt), "prompt")
    if fields.suffix:
        prompt, heal = await openai_fim_prompt(state, prompt, fields.suffix, sampling.max_tokens,
                                               heal=grammar is None)
        sampling = dataclasses.replace(sampling, heal=heal)
    req = GenRequest("completions", profile.name, sampling, spec, verify, stream=bool(fields.stream), prompt=prompt,
                     cache_prompt=fields.cache_prompt is not False, limit=limit)
    return req, fields


async def completions(request: Request) -> Response:
    req, fields = await completion_request(request)
    job = await start(request.app.state.server, req, request)
    if req.stream:
        return stream(request, job, _chunks(job, head("text_completion", req), fields.include_usage))
    out = await answer(job, request)
    return respond(job, None if out is None else {**head("text_completion", req), "choices": [traced({
        "text": out.text, "index": 0, "logprobs": None, "finish_reason": out.reason, **out.detail}, out.trace)]})


async def _chunks(job: Job, head: dict, include_usage: bool):
    async for event in events(job):
        if event.__class__ is not Text:
            last = {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": event.reason,
                                         **event.detail}]}
        elif event.text:
            yield {**head, "choices": [traced({"text": event.text, "index": 0, "logprobs": None,
                                               "finish_reason": None}, event.trace)]}
    async for chunk in stream_end(head, last, job, include_usage):
        yield chunk


async def models(request: Request) -> Response:
    state = request.app.state.server
    created = int(time.time())
    draft = state.engine.draft
    # File names, not paths: a path tells a client about the host's directories and user names.
    data = [{"id": name, "object": "model", "created": created, "owned_by": "specserve",
             "specserve": {"target": Path(state.engine.target.path).name,
                           "draft": Path(draft.path).name if draft is not None else None,
                           "n_ctx": state.engine.n_ctx, **p.describe()}}
            for name, p in state.profiles.items()]
    return JSONResponse({"object": "list", "data": data})
