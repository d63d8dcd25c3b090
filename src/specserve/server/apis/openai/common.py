"""What OpenAI's endpoints share in the answer's shape: ids, usage, the stream's end (the request fields
they add: protocol.OpenAIGeneration). Speculation shows up as extensions: a request's `speculative`
object picks the mode and lengths, `usage.speculative` reports what speculation did for it; with
`speculative.trace`, each choice's `speculative_trace` says who produced each token of its text
(core/trace.py, docs/webui.md).
"""
from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from starlette.responses import JSONResponse, Response

from ...core.answer import speculative_usage
from ...core.jobs import CLIENT_GONE, Job
from ...core.request import GenRequest
from ...state import ServerState
from ..llama.answer import final
from ..llama.props import SYSTEM_FINGERPRINT
from ..shared.timings import timings
from .protocol import OpenAIGeneration


def head(kind: str, req: GenRequest) -> dict:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
            "model": req.model, "system_fingerprint": SYSTEM_FINGERPRINT}


def usage(*jobs: Job) -> dict:
    """The usage of the jobs that made an answer (several for `n` > 1): tokens summed, the prompt's once
    per job; `speculative`: the first job's (where one answer was made by several)."""
    n_prompt, n_generated = sum(j.stats.n_prompt for j in jobs), sum(j.stats.n_generated for j in jobs)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_generated, "total_tokens": n_prompt + n_generated,
            "prompt_tokens_details": {"cached_tokens": sum(j.stats.n_cached for j in jobs)},
            "speculative": speculative_usage(jobs[0])}


async def stream_end(head: dict, last: dict, job: Job, include_usage: bool) -> AsyncIterator:
    """The final chunk with usage, a usage-only chunk if asked (stream_options.include_usage), [DONE].
    The last of them carries llama-server's `timings`."""
    await job.finished()
    if include_usage:
        yield {**last, "usage": usage(job)}
        yield {**head, "choices": [], "usage": usage(job), "timings": timings(job)}
    else:
        yield {**last, "usage": usage(job), "timings": timings(job)}
    yield "[DONE]"


def respond(jobs: Job | list[Job], body: dict | None) -> Response:
    """A whole answer with its usage and llama-server's `timings` (the first job's), or CLIENT_GONE where
    the client left while it waited (`body` None)."""
    if body is None:
        return Response(status_code=CLIENT_GONE)
    jobs = jobs if isinstance(jobs, list) else [jobs]
    return JSONResponse({**body, "usage": usage(*jobs), "timings": timings(jobs[0])})


def verbose(state: ServerState, fields: OpenAIGeneration, job: Job, out) -> dict:
    """llama-server's `__verbose` (the answer in /completion's shape: the prompt as rendered, the settings),
    where the request or the server's --verbose asks for it."""
    if not (fields.verbose or state.settings.verbose and fields.verbose is not False):
        return {}
    return {"__verbose": final(job, out.text, out.tokens)}
