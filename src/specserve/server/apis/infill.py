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
`n_cmpl` > 1 answers an array of that many completions, as llama-server does (llama.vscode asks for 3):
sampled ones run at once on as many slots (several.py; at most the server's slots), a greedy request's
are one generation handed out n times (they would be identical), at most MAX_GREEDY_COPIES.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time

import anyio
from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...fim import FimUnsupported, Infill, fim_tokens, healed
from ...grammar.healing import vocab_of
from ..core.answer import events
from ..core.events import Text
from ..core.jobs import CLIENT_GONE, DISCONNECT_CHECK_S, Job, start
from ..core.request import GenRequest
from ..http.body import read_json
from ..http.endpoint import Endpoint
from ..http.errors import bad_request
from . import several
from .infill_rules import LineRules, fim_prompt, select_fields
from .llama import llama_request
from .llama_answer import final
from .openai_common import key_scope, stream
from .validation import Fields, parse

# fields /infill reads itself; the rest is /completion's
_OWN = ("input_prefix", "input_suffix", "input_extra", "prompt", "n_indent", "t_max_predict_ms", "t_max_prompt_ms",
        "n_cmpl", "response_fields", "samplers", "n_predict")
MAX_GREEDY_COPIES = 16  # n_cmpl of a greedy request: copies of one generation, on a server of fewer slots
_EXTRA_SHAPE = 'input_extra must be an array of {"filename": string, "text": string} objects (text required)'


class InfillRequest(Fields):
    """/infill's own fields; the rest of the body is checked as /completion's."""

    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[tuple[str, str]] = []  # (filename, text)
    prompt: str | None = None  # the cursor's line up to the cursor
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None  # accepted; not applied, as in llama-server
    n_cmpl: int | None = None
    response_fields: list[str] | None = None
    n_predict: int | None = None

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


def _samplers(body: dict) -> dict:
    """The body as /completion's checks should see it: llama.cpp's `infill` sampler (and a chain
    without temperature at temperature 0) means greedy decoding here."""
    samplers = body.get("samplers")
    if not isinstance(samplers, list):
        return body
    names = [s.lower() if isinstance(s, str) else s for s in samplers]
    temperature = body.get("temperature")
    greedy_temp = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0
    if "infill" in names or ("temperature" not in names and greedy_temp):
        body = {k: v for k, v in body.items() if k != "samplers"}
        body["temperature"] = 0.0
    return body


async def _parse(request: Request) -> tuple[GenRequest, Infill, InfillRequest]:
    """(GenRequest without its prompt, the Infill to lay out, /infill's own fields)."""
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    own = parse(InfillRequest, body)
    infill = Infill(prefix=own.input_prefix or "", suffix=own.input_suffix or "", prompt=own.prompt or "",
                    extra=own.input_extra)
    rest = {k: v for k, v in _samplers(body).items() if k not in _OWN or k == "samplers"}
    if own.n_predict == 0:  # nothing is sampled: the sampling fields do not matter, as in llama-server
        rest = {k: v for k, v in rest.items() if k in ("model", "cache_prompt", "speculative", "stream", "id_slot")}
        rest["n_predict"] = 1
    elif own.n_predict is not None:
        rest["n_predict"] = own.n_predict
    req, _ = llama_request(rest, state, key_scope(request), endpoint="infill", prompt=[0])
    req = dataclasses.replace(req, warm=own.n_predict == 0)
    if req.spec.trace:  # the line rules cut the text after the fact: runs would not match it
        raise bad_request("speculative.trace is not available on /infill", "speculative.trace", "unsupported_parameter")
    n_slots = len(state.scheduler.pool.slots)
    several.count(own.n_cmpl, max(n_slots, MAX_GREEDY_COPIES) if req.sampling.greedy else n_slots, "n_cmpl",
                  req.stream)
    return req, infill, own


async def infill(request: Request) -> Response:
    state = request.app.state.server
    req, fim_req, own = await _parse(request)
    target = state.engine.target
    tokens = await anyio.to_thread.run_sync(fim_prompt, target, fim_req, state.engine.n_ctx, own.n_predict or 0)
    tokens, heal = healed(target, tokens, fim_req)
    req = dataclasses.replace(req, prompt=tokens, sampling=dataclasses.replace(req.sampling, heal=heal))
    n = own.n_cmpl or 1
    if n > 1:
        return await _several(request, state, req, own, n)
    job, rules = await _start(request, state, req, own)

    def answer(content: str) -> dict:
        return _shaped(job, rules, content, own)

    if req.stream:
        async def chunks():
            async for event in events(job):
                if event.__class__ is not Text:
                    continue
                text = rules.push(event.text)
                yield {"content": text, "tokens": event.tokens, "stop": False}
                if rules.stopped:
                    _stop(job)
                    break
            await job.finished()
            yield answer("")
        return stream(request, job, chunks())
    content = await _collect(job, rules, request)
    if content is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(answer(content))


async def _start(request: Request, state, req: GenRequest, own: InfillRequest) -> tuple[Job, LineRules]:
    t_start = time.perf_counter()
    job = await start(state, req, request)
    # the time rule counts from the end of the prompt, as llama-server's t_start_generation
    return job, LineRules(own.n_indent or 0, own.t_max_predict_ms or 0, t_start + job.queue_s + job.stats.t_prompt)


def _shaped(job: Job, rules: LineRules, content: str, own: InfillRequest, index: int = 0) -> dict:
    out = {**final(job, content, []), "index": index}
    if rules.stopped:
        out["stop_type"] = "limit"
    return select_fields(out, own.response_fields) if own.response_fields else out


async def _several(request: Request, state, req: GenRequest, own: InfillRequest, n: int) -> Response:
    """n_cmpl > 1: an array of n completions, each under its own line rules (several.variants: one run for a
    greedy request). The first refusal is raised once every run has ended."""
    async def one(run: GenRequest) -> tuple[Job, LineRules, str | None]:
        job, rules = await _start(request, state, run, own)
        return job, rules, await _collect(job, rules, request)

    runs = several.variants(req, n)
    results = await asyncio.gather(*(one(r) for r in runs), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    if any(content is None for _, _, content in results):
        return Response(status_code=CLIENT_GONE)
    picked = [results[i % len(results)] for i in range(n)]
    return JSONResponse([_shaped(job, rules, content, own, i) for i, (job, rules, content) in enumerate(picked)])


def _stop(job: Job) -> None:
    """End the generation where a line rule cut it: finished by its limit, as llama-server counts it."""
    if not job.stats.finish_reason:
        job.stats.finish_reason = "length"
    job.finish()


async def _collect(job: Job, rules: LineRules, request: Request) -> str | None:
    """The text under the line rules, or None if the client went away; the slot is back on return."""
    parts = []
    next_check = time.monotonic() + DISCONNECT_CHECK_S
    try:
        async for chunk in job.chunks():
            parts.append(rules.push(chunk.text))
            if rules.stopped:
                _stop(job)
                break
            if time.monotonic() >= next_check:
                if await request.is_disconnected():
                    return None
                next_check = time.monotonic() + DISCONNECT_CHECK_S
    finally:
        job.finish()
        await job.finished()
    return "".join(parts)
