"""llama-server's POST /infill, as llama.vim and llama.vscode call it, and FIM for /v1/completions.

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

import anyio
from pydantic import field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....fim import FimUnsupported, Infill, fim_tokens, healed
from ....grammar.healing import vocab_of
from ...core.answer import answer, events
from ...core.events import Text
from ...core.jobs import CLIENT_GONE, start
from ...core.request import GenRequest
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...http.guard import key_scope
from ..shared.answer import stream
from ..shared.builder import Api, Prompt, ServerView, build_request
from ..shared.constraint_fields import refuse_constraints
from ..shared.fim_prompts import fim_prompt
from .answer import final
from .completion import LlamaRequest
from .infill_rules import LineRules, select_fields

_EXTRA_SHAPE = 'input_extra must be an array of {"filename": string, "text": string} objects (text required)'


class InfillRequest(LlamaRequest):
    """/infill's own fields beside /completion's."""

    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[tuple[str, str]] = []  # (filename, text)
    prompt: str | None = None  # the cursor's line up to the cursor
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None  # accepted; not applied, as in llama-server
    response_fields: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _infill_sampler(cls, body):
        """llama.cpp's `infill` sampler (and a chain without temperature at temperature 0) means greedy
        decoding here."""
        if not isinstance(body, dict) or not isinstance(body.get("samplers"), list):
            return body
        names = [s.lower() if isinstance(s, str) else s for s in body["samplers"]]
        temperature = body.get("temperature")
        greedy_temp = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0
        if "infill" in names or ("temperature" not in names and greedy_temp):
            body = {k: v for k, v in body.items() if k != "samplers"}
            body["temperature"] = 0.0
        return body

    @field_validator("input_extra", mode="before")
    @classmethod
    def _extra(cls, value) -> list[tuple[str, str]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise bad_request(_EXTRA_SHAPE, "input_extra")
        out = []
        for i, chunk in enumerate(value):
            if not isinstance(chunk, dict):
                raise bad_request(_EXTRA_SHAPE, f"input_extra[{i}]")
            filename, text = chunk.get("filename", "tmp"), chunk.get("text")  # text required, as llama-server
            if not isinstance(filename, str) or not isinstance(text, str):
                raise bad_request(_EXTRA_SHAPE, f"input_extra[{i}]")
            out.append((filename, text))
        return out

    @field_validator("n_indent", "t_max_predict_ms", "t_max_prompt_ms")
    @classmethod
    def _nonneg(cls, value, info):
        if value is not None and value < 0:
            raise bad_request(f"{info.field_name} must be >= 0, got {value}", info.field_name)
        return value

    @field_validator("response_fields", mode="before")
    @classmethod
    def _fields(cls, value):
        if value is not None and not (isinstance(value, list) and all(isinstance(f, str) for f in value)):
            raise bad_request("response_fields must be an array of strings", "response_fields")
        return value


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


async def infill_prompt(fields: InfillRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The model's FIM layout of the body (fim.py), its cursor's line healed."""
    infill = Infill(prefix=fields.input_prefix or "", suffix=fields.input_suffix or "", prompt=fields.prompt or "",
                    extra=fields.input_extra)
    tokens = await anyio.to_thread.run_sync(fim_prompt, server.target, infill, server.n_ctx, fields.n_predict or 0)
    tokens, heal = healed(server.target, tokens, infill)
    return Prompt(prompt=tokens, heal=heal)


def infill_constraints(fields: InfillRequest, body: dict, prompt: Prompt, target) -> None:
    refuse_constraints(body, fields, "infill")


def check_infill(fields: InfillRequest, req: GenRequest) -> None:
    if req.spec.trace:  # the line rules cut the text after the fact: runs would not match it
        raise bad_request("speculative.trace is not available on /infill", "speculative.trace", "unsupported_parameter")
    n_cmpl = 1 if fields.n_cmpl is None else fields.n_cmpl
    if n_cmpl < 1 or n_cmpl > 1 and not req.sampling.greedy:
        raise bad_request(f"n_cmpl={n_cmpl}: this server answers one completion a request (n_cmpl > 1 only for a "
                          "greedy request, whose completions would all be the same)", "n_cmpl", "unsupported_parameter")


INFILL = Api("infill", InfillRequest, infill_prompt, limits=("n_predict", "max_tokens"), handles=("t_max_predict_ms",),
             random_seed=-1, warms=True, tools=infill_constraints, check=check_infill)


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
