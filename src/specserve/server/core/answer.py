"""A running Job's answer, as every adapter consumes it: a stream of events, or the whole answer.

`events(job)` for a streamed answer (events.py: Text, CallStart, CallArguments, then Finish);
`answer(job, request)` for a whole one. Where the request's tools are read back (GenRequest.reads_calls),
the text goes through the CallReader once, here, for every API. `speculative_usage` is what
speculation did for the request, the `speculative` object every API's usage carries; `finish_detail`
says why an answer ended where the finish reason alone would not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from starlette.requests import Request

from ...stats import GenerationStats
from .constraints.toolcalls import Call, CallReader, finish
from .events import Event, Finish, Text
from .jobs import Job
from .trace import target_alone_tokens_per_s


@dataclass
class Answer:
    """A whole answer. `message`: the assistant message in the chat form templates take (OpenAI's:
    content, and tool_calls where calls were read back); `content`: the text outside tool calls
    (all of `text` when none are read); `reason`, `detail`: as in events.Finish; `trace`: the runs
    of the whole text by producer (speculative.trace), else None."""

    text: str
    tokens: list[int]
    reason: str
    detail: dict
    message: dict
    content: str
    calls: list[Call]
    trace: list[dict] | None


async def events(job: Job) -> AsyncIterator[Event]:
    """The answer's events as its tokens are committed; the last is Finish."""
    if not job.req.reads_calls:
        tracer = job.tracer
        while (chunk := await job.step()) is not None:  # per token: one event, nothing more
            yield Text(chunk.text, chunk.tokens, tracer.feed(chunk) if tracer is not None else None)
        yield Finish(job.finish_reason, finish_detail(job.stats), job.stats)
        return
    reader = CallReader(job.req.tools.form)
    async for chunk in job.chunks():
        for event in reader.feed(chunk.text):
            yield event
    for event in reader.close():
        yield event
    yield Finish(finish(reader, job.finish_reason), finish_detail(job.stats, reader.cut()), job.stats)


async def answer(job: Job, request: Request) -> Answer | None:
    """The whole answer once generation has ended and the slot is back; None if the client left."""
    out = await job.run_to_end(request)
    if out is None:
        return None
    text, tokens = out
    trace = job.tracer.entries if job.tracer is not None else None
    if not job.req.reads_calls:
        return Answer(text, tokens, job.finish_reason, finish_detail(job.stats), {"role": "assistant", "content": text},
                      text, [], trace)
    reader = CallReader(job.req.tools.form)
    reader.feed(text)
    reader.close()
    return Answer(text, tokens, finish(reader, job.finish_reason), finish_detail(job.stats, reader.cut()),
                  reader.message(), reader.content, reader.calls, trace)


def finish_detail(stats: GenerationStats, cut: str | None = None) -> dict:
    """The answer's `finish_detail` (a specserve extension), where the finish reason alone would not
    say why the answer ended as it did: a tool call cut short; a grammar with no way forward, which
    a server's answer never ends with (jobs.dead_end makes that an error before the Finish)."""
    if stats.grammar_error:
        return {"finish_detail": f"the output constraint allowed no further token: {stats.grammar_error}"}
    if cut and stats.finish_reason == "length":
        return {"finish_detail": f"{cut} when max_tokens ended the answer"}
    if cut:
        return {"finish_detail": cut}
    return {}


def speculative_usage(job: Job) -> dict:
    """What speculation did for this request (`usage.speculative` in every API's answer)."""
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
