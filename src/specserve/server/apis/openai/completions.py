"""OpenAI's POST /v1/completions (with `suffix`: fill in the middle, laid out as /infill)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...core.answer import events
from ...core.events import Text
from ...core.jobs import Job, start
from ...core.params import Limit
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...http.guard import key_scope
from ..shared import several
from ..shared.answer import stream, traced
from ..shared.builder import Api, Prompt, ServerView, build_request
from ..shared.fields import prompt_value, required
from ..shared.fim_prompts import openai_fim_prompt
from ..shared.probs import count, legacy
from .common import OpenAIGeneration, head, respond, stream_end, verbose

DEFAULT_MAX_TOKENS = Limit("max_tokens", 16)  # /v1/completions without max_tokens: OpenAI's default


class CompletionRequest(OpenAIGeneration):
    prompt: Any = None  # a string or token ids: fields.prompt_value
    suffix: str | None = None
    max_tokens: int | None = None
    echo: bool | None = None  # the prompt's text before each choice's
    logprobs: int | None = None  # each answer token's logprob and this many alternatives (OpenAI's legacy shape)

    def logprobs_asked(self) -> tuple[int, str] | None:
        if self.logprobs is None:
            return None
        if self.echo:  # the prompt's logprobs, which echo gives with them, are not computed
            raise bad_request("logprobs with echo is not supported: the prompt's logprobs are not computed",
                              "logprobs", "unsupported_parameter")
        return count(self.logprobs, "logprobs"), "raw"


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/completions", completions)]


async def completion_prompt(fields: CompletionRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The prompt; with `suffix`, the FIM prompt /infill would lay out, healed unless a grammar constrains
    the answer instead."""
    prompt = required(prompt_value(fields.prompt), "prompt")
    if fields.echo and fields.suffix:
        raise bad_request("echo and suffix cannot be used together", "echo")
    if not fields.suffix:
        return Prompt(prompt=prompt)
    tokens, heal = await openai_fim_prompt(server, prompt, fields.suffix, max_tokens, heal=not fields.requested())
    return Prompt(prompt=tokens, heal=heal)


COMPLETIONS = Api("completions", CompletionRequest, completion_prompt, limits=("max_tokens",),
                  default_limit=DEFAULT_MAX_TOKENS, handles=("suffix", "n", "echo", "logprobs"))


def echoed(job: Job, fields: CompletionRequest) -> str:
    """The prompt's text where `echo` asks for it (token ids written back as text)."""
    if not fields.echo:
        return ""
    prompt = job.req.prompt
    return prompt if isinstance(prompt, str) else job.state.engine.target.detokenize(prompt).decode("utf-8", "replace")


async def completions(request: Request) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, fields = await build_request(COMPLETIONS, body, ServerView.of(state, key_scope(request.scope)))
    n = several.count(fields.n, len(state.scheduler.pool.slots), stream=req.stream)
    if req.stream:
        job = await start(state, req, request)
        return stream(request, job, _chunks(job, head("text_completion", req), fields))
    outs = await several.answers(state, several.variants(req, n), request)
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
