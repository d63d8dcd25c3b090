"""OpenAI's POST /v1/completions (with `suffix`: fill in the middle, laid out as /infill)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...core.answer import events
from ...core.events import Text
from ...core.jobs import Job, start
from ...http.endpoint import Endpoint
from ..shared import n_completions
from ..shared.answer import stream, traced
from ..shared.builder import request_of
from ..shared.logprob_shapes import legacy
from .common import head, respond, stream_end, verbose
from .protocol import CompletionRequest
from .request import COMPLETIONS


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/completions", completions)]


def echoed(job: Job, fields: CompletionRequest) -> str:
    """The prompt's text where `echo` asks for it (token ids written back as text)."""
    if not fields.echo:
        return ""
    prompt = job.req.prompt
    return prompt if isinstance(prompt, str) else job.state.engine.target.detokenize(prompt).decode("utf-8", "replace")


async def completions(request: Request) -> Response:
    state, req, fields = await request_of(COMPLETIONS, request)
    n = n_completions.count(fields.n, state.n_slots, stream=req.stream)
    if req.stream:
        job = await start(state, req, request)
        return stream(request, job, _chunks(job, head("text_completion", req), fields))
    outs = await n_completions.answers(state, n_completions.variants(req, n), request)
    if outs is None:
        return respond([], None)
    choices = [(job, out) for job, out in outs for _ in range(n // len(outs))]  # greedy: one answer, n times
    return respond([job for job, _ in outs], {**head("text_completion", req), "choices": [traced({
        "text": echoed(job, fields) + out.text, "index": i, "logprobs": _logprobs(job, out.logprobs),
        "finish_reason": out.reason,
        **out.detail}, out.trace) for i, (job, out) in enumerate(choices)], **verbose(state, fields, *outs[0])})


def _logprobs(job: Job, rows, offset: int = 0) -> dict | None:
    return legacy(job.state.engine.target, rows, offset) if rows is not None else None


async def _chunks(job: Job, head: dict, fields: CompletionRequest):
    if fields.echo:
        yield {**head, "choices": [{"text": echoed(job, fields), "index": 0, "logprobs": None, "finish_reason": None}]}
    pending, offset = [] if job.logprobs is not None else None, 0  # logprobs not yet sent; where their text starts
    async for event in events(job):
        rows = None
        if pending is not None and (event.text if event.__class__ is Text else True):
            rows = pending + (event.logprobs or []) if event.__class__ is Text else pending
            pending = []
        elif pending is not None:
            pending += event.logprobs or []  # a token whose text is held back: sent with the next text
        if event.__class__ is not Text:
            last = {**head, "choices": [{"text": "", "index": 0, "logprobs": _logprobs(job, rows, offset),
                                         "finish_reason": event.reason, **event.detail}]}
        elif event.text:
            lp = _logprobs(job, rows, offset)
            offset += len(event.text)
            yield {**head, "choices": [traced({"text": event.text, "index": 0, "logprobs": lp,
                                               "finish_reason": None}, event.trace)]}
    async for chunk in stream_end(head, last, job, fields.include_usage):
        yield chunk
