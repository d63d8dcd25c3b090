"""OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models.

Responses follow OpenAI's shapes; speculation shows up as extensions: a request's
`speculative` object picks the mode and lengths, and `usage.speculative` reports
what speculation did for it; with `speculative.trace`, each choice's `speculative_trace`
says who produced each token of its text (trace.py, docs/webui.md).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Callable

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .errors import ApiError, bad_request, error_body
from .infill_rules import openai_fim_prompt
from .jobs import CLIENT_GONE, Job, start
from .params import COMPLETIONS_MAX_TOKENS, KEY_SCOPE, GenRequest, check_messages, check_unsupported, \
    completion_prompt, get, read_json, resolve_profile, sampling_params, spec_params
from .structured import finish_detail
from .toolcalls import CallReader, answer, finish, stream
from .tools import request_constraint
from .trace import target_alone_tokens_per_s

log = logging.getLogger("specserve.server")


def speculative_usage(job: Job) -> dict:
    s, spec = job.stats, job.req.spec
    return {"mode": spec.mode, "verify": job.req.verify, "draft_max": spec.draft_max, "suffix_max": spec.suffix_max,
            "drafter_steps": dict(s.drafter_steps), "passes": s.n_passes, "drafted": s.n_drafted,
            "accepted": s.n_accepted, "acceptance": round(s.acceptance, 4),
            "mean_accepted_len": round(s.mean_accepted_len, 4), "tokens_per_s": round(s.tokens_per_s, 2),
            "drafted_by_position": list(s.drafted_by_position), "accepted_by_position": list(s.accepted_by_position),
            "prompt_s": round(s.t_prompt, 4), "decode_s": round(s.t_decode, 4) if s.t_total else 0.0,
            **_grammar_usage(job), **_traced_usage(job)}


def _grammar_usage(job: Job) -> dict:
    """Under an output constraint, the seconds of its decode spent in the grammar (stats.t_grammar)."""
    return {"grammar_s": round(job.stats.t_grammar, 5)} if job.req.sampling.grammar is not None else {}


def _traced_usage(job: Job) -> dict:
    """With the trace on, the speed to compare with: the target alone's, where the server has measured it."""
    if not job.req.spec.trace:
        return {}
    return {"target_alone_tokens_per_s": target_alone_tokens_per_s(job.state.engine.controller, job.stats)}


def traced(choice: dict, job: Job, whole: bool = False) -> dict:
    """The choice with its `speculative_trace` (of the last chunk, or the whole text), if the request asked."""
    if job.tracer is None:
        return choice
    return {**choice, "speculative_trace": job.tracer.entries if whole else job.tracer.last}


def usage(job: Job) -> dict:
    s = job.stats
    return {"prompt_tokens": s.n_prompt, "completion_tokens": s.n_generated,
            "total_tokens": s.n_prompt + s.n_generated, "prompt_tokens_details": {"cached_tokens": s.n_cached},
            "speculative": speculative_usage(job)}


def sse(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)) + "\n\n"


def sse_response(request: Request, job: Job, events: Callable[[Job], AsyncIterator]) -> StreamingResponse:
    """Stream `events(job)` as server-sent events. However the stream ends (done, client
    gone, drain deadline, error), the job is finished: generation stops and its slot is freed.
    After the headers an error can only be an event: `{"error": ...}` in OpenAI's shape, which
    OpenAI's clients raise, and no `[DONE]`."""
    state = request.app.state.server

    async def body():
        try:
            async for obj in events(job):
                yield sse(obj)
            await job.finished()  # the stream's end means the request is accounted for
        except ApiError as e:  # a refusal mid-stream: the drain's deadline
            state.metrics.error(e.status)
            log.info("%d %s %s mid-stream: %s", e.status, request.method, request.url.path, e.message)
            yield sse(e.body())
        except Exception as e:  # headers are sent: the error goes in the stream
            log.exception("error while streaming")
            state.metrics.error(500)
            yield sse(error_body(500, f"internal server error: {type(e).__name__}", code="internal_error"))
        finally:
            job.finish()

    return StreamingResponse(body(), media_type="text/event-stream", background=BackgroundTask(job.finish),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _request(request: Request, endpoint: str) -> GenRequest:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    profile = resolve_profile(body, state.profiles, state.settings.model_name)
    chat = endpoint == "chat"
    suffix = None if chat else body.pop("suffix", None)  # fill in the middle (infill.py)
    check_unsupported(body)
    sampling, limit = sampling_params(body, profile, state.engine.n_ctx,
                                      ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",),
                                      default_max=None if chat else COMPLETIONS_MAX_TOKENS)
    spec, verify = spec_params(body.get("speculative"), profile, state.engine.draft is not None,
                               request.scope.get(KEY_SCOPE))
    options = get(body, "stream_options", dict, {})
    messages = get(body, "messages", list) if chat else None
    if chat and not messages:
        raise bad_request("messages must be a non-empty array", "messages")
    if chat:
        check_messages(messages)
    grammar, tools = await request_constraint(body, state, chat)
    if grammar is not None:
        sampling = dataclasses.replace(sampling, grammar=grammar)
    prompt = None if chat else completion_prompt(body)
    if suffix is not None and suffix != "":
        prompt, heal = await openai_fim_prompt(state, prompt, suffix, sampling.max_tokens, heal=grammar is None)
        sampling = dataclasses.replace(sampling, heal=heal)
    req = GenRequest(endpoint, profile.name, sampling, spec, verify, stream=get(body, "stream", bool, False),
                     prompt=prompt, messages=messages,
                     include_usage=get(options, "include_usage", bool, False, "stream_options.include_usage"),
                     cache_prompt=get(body, "cache_prompt", bool, True), limit=limit, tools=tools)
    return req


def _head(kind: str, req: GenRequest) -> dict:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": req.model}


async def _stream_end(head: dict, last: dict, job: Job, req: GenRequest) -> AsyncIterator:
    """The final chunk with usage, a usage-only chunk if asked (stream_options.include_usage), [DONE]."""
    yield {**last, "usage": usage(job)}
    if req.include_usage:
        yield {**head, "choices": [], "usage": usage(job)}
    yield "[DONE]"


async def _respond(request: Request, job: Job, body: Callable[[str], dict]) -> Response:
    """A non-streamed response: the whole text, or CLIENT_GONE if the client left while it waited."""
    out = await job.run_to_end(request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    text, _ = out
    return JSONResponse({**body(text), "usage": usage(job)})


async def completions(request: Request) -> Response:
    req = await _request(request, "completions")
    job = await start(request.app.state.server, req, request)
    head = _head("text_completion", req)
    if req.stream:
        async def events(job: Job):
            async for chunk in job.chunks():
                if chunk.text:
                    yield {**head, "choices": [traced({"text": chunk.text, "index": 0, "logprobs": None,
                                                       "finish_reason": None}, job)]}
            last = {**head, "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": job.finish_reason,
                                         **finish_detail(job.stats)}]}
            async for event in _stream_end(head, last, job, req):
                yield event
        return sse_response(request, job, events)
    return await _respond(request, job, lambda text: {**head, "choices": [traced({
        "text": text, "index": 0, "logprobs": None, "finish_reason": job.finish_reason, **finish_detail(job.stats)},
        job, whole=True)]})


async def chat_completions(request: Request) -> Response:
    req = await _request(request, "chat")
    job = await start(request.app.state.server, req, request)
    calls = req.tools is not None and req.tools.choice != "none"  # read tool calls back from the text
    if req.stream:
        head = _head("chat.completion.chunk", req)

        def choice(delta: dict, finish: str | None = None, trace: bool = False, detail: dict | None = None) -> dict:
            c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **(detail or {})}
            return {**head, "choices": [traced(c, job) if trace else c]}

        async def events(job: Job):
            yield choice({"role": "assistant", "content": ""})
            if calls:
                reader = CallReader(req.tools.form)
                async for delta in stream(reader, job.chunks()):
                    yield choice(delta)
                last = choice({}, finish(reader, job.finish_reason), detail=finish_detail(job.stats, reader.cut()))
            else:
                async for chunk in job.chunks():
                    if chunk.text:
                        yield choice({"content": chunk.text}, trace=True)
                last = choice({}, job.finish_reason, detail=finish_detail(job.stats))
            async for event in _stream_end(head, last, job, req):
                yield event
        return sse_response(request, job, events)

    def body(text: str) -> dict:
        message, reason, cut = answer(req.tools.form, text, job.finish_reason) if calls else \
            ({"role": "assistant", "content": text}, job.finish_reason, None)
        return {**_head("chat.completion", req), "choices": [traced({
            "index": 0, "message": message, "logprobs": None, "finish_reason": reason,
            **finish_detail(job.stats, cut)}, job, whole=True)]}
    return await _respond(request, job, body)


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
