"""A running Job's answer, as every adapter consumes it: a stream of events, or the whole answer.

`events(job)` for a streamed answer (events.py: Reasoning, Text, CallStart, CallArguments, then
Finish); `answer(job, request)` for a whole one. Where the answer is read (a reasoning block to part:
GenRequest.reasoning_format; tools to read back: GenRequest.reads_calls), the text goes through one
AnswerReader (reading.py), here, for every API; a tool call that repeats one ends the answer there.
An answer read for neither may be cut short by the caller's rule on its text (`Cut`: /infill's lines).
`speculative_usage` is what speculation did for the request, the `speculative` object every API's
usage carries; `finish_detail` says why an answer ended where the finish reason alone would not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol

from starlette.requests import Request

from ...logprobs import TokenLogprob
from ...stats import GenerationStats
from .constraints.toolcalls import Call
from .events import Event, Finish, Text
from .jobs import Job
from .answer_reader import AnswerReader
from .trace import target_alone_tokens_per_s


@dataclass
class Answer:
    """A whole answer. `message`: the assistant message in the chat form templates take (OpenAI's:
    content, reasoning_content where the answer reasoned, and tool_calls where calls were read back);
    `content`: the answer's text outside reasoning and tool calls (all of `text` when neither is read);
    `reasoning`: the reasoning block's text ("" without one); `reason`, `detail`: as in events.Finish;
    `trace`: the runs of the whole text by producer (speculative.trace), else None; `logprobs`: one per
    token of `tokens` where the request asks (SamplingParams.logprobs), else None; `cut`: the tool call
    cut short, where its name was whole (events.Finish.cut)."""

    text: str
    tokens: list[int]
    reason: str
    detail: dict
    message: dict
    content: str
    calls: list[Call]
    trace: list[dict] | None
    reasoning: str = ""
    logprobs: list[TokenLogprob] | None = None
    cut: Call | None = None

    @property
    def cut_by_limit(self) -> Call | None:
        """The call max_tokens cut short (reported by the APIs that show a cut call), else None."""
        return self.cut if self.reason == "length" else None


class Cut(Protocol):
    """A rule that ends an answer early on its text (llama-server's /infill line rules): `push` gives the
    part of a chunk's text to keep, and sets `stopped` where the answer ends there, by its limit."""

    stopped: bool

    def push(self, text: str) -> str: ...


def reader_for(job: Job) -> AnswerReader | None:
    """The job's answer reader, or None where its text is handed out as it comes."""
    if job.parting is None and not job.req.reads_calls:
        return None
    return AnswerReader(job.parting, job.req.tools if job.req.reads_calls else None)


async def events(job: Job, cut: Cut | None = None) -> AsyncIterator[Event]:
    """The answer's events as its tokens are committed; the last is Finish. `cut`: where the text ends
    early (an answer not read for reasoning or calls)."""
    tracer, reader = job.tracer, reader_for(job)
    if reader is None:
        while (chunk := await job.step()) is not None:  # per token: one event, nothing more
            text = chunk.text if cut is None else cut.push(chunk.text)
            yield Text(text, chunk.tokens, tracer.feed(chunk) if tracer is not None else None, chunk.logprobs)
            if cut is not None and cut.stopped:
                _cut_short(job)
                break
        yield Finish(job.finish_reason, finish_detail(job.stats), job.stats)
        return
    while (chunk := await job.step()) is not None:
        for event in reader.feed(chunk.text, chunk.tokens, tracer.feed(chunk) if tracer is not None else None,
                                 chunk.logprobs):
            yield event
        if reader.ended:
            _stop(job)
            break
    for event in reader.close():
        yield event
    yield Finish(reader.finish(job.finish_reason), finish_detail(job.stats, reader.cut()), job.stats,
                 reader.cut_call)


def _stop(job: Job) -> None:
    """End generation where a repeated tool call ended the answer (it ended on its calls, not cancelled)."""
    job.stats.finish_reason = "stop"
    job.finish()


def _cut_short(job: Job) -> None:
    """End generation where a Cut ended the answer: finished by its limit, as llama-server counts it."""
    if not job.stats.finish_reason:
        job.stats.finish_reason = "length"
    job.finish()


async def answer(job: Job, request: Request, cut: Cut | None = None) -> Answer | None:
    """The whole answer once generation has ended and the slot is back; None if the client left.
    `cut`: where the text ends early (an answer not read for reasoning or calls)."""
    reader, kept = reader_for(job), []

    def ended(chunk) -> bool:
        reader.feed(chunk.text)
        if reader.ended:
            job.stats.finish_reason = "stop"
        return reader.ended

    def cut_at(chunk) -> bool:
        kept.append(cut.push(chunk.text))
        if cut.stopped and not job.stats.finish_reason:
            job.stats.finish_reason = "length"
        return cut.stopped

    until = ended if reader is not None else cut_at if cut is not None else None
    out = await job.run_to_end(request, until)
    if out is None:
        return None
    text, tokens = out
    if cut is not None and reader is None:
        text = "".join(kept)
    trace = job.tracer.entries if job.tracer is not None else None
    if reader is None:
        return Answer(text, tokens, job.finish_reason, finish_detail(job.stats), {"role": "assistant", "content": text},
                      text, [], trace, logprobs=job.logprobs)
    reader.close()
    calls = reader.calls.calls if reader.calls is not None else []
    return Answer(text, tokens, reader.finish(job.finish_reason), finish_detail(job.stats, reader.cut()),
                  reader.message(), reader.content, calls, trace, reader.reasoning, job.logprobs, reader.cut_call)


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
            "queue_s": round(job.queue_s, 4),  # waiting for a slot, before prompt_s: what load adds to a request
            **_grammar_usage(job), **_traced_usage(job)}


def _grammar_usage(job: Job) -> dict:
    """Under an output constraint, the seconds of its decode spent in the grammar (stats.t_grammar)."""
    return {"grammar_s": round(job.stats.t_grammar, 5)} if job.req.sampling.grammar is not None else {}


def _traced_usage(job: Job) -> dict:
    """With the trace on, the speed to compare with: the target alone's, where the server has measured it."""
    if not job.req.spec.trace:
        return {}
    return {"target_alone_tokens_per_s": target_alone_tokens_per_s(job.state.engine.controller, job.stats)}
