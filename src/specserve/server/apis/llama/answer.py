"""The answer of llama-server's /completion (and /infill's), in its shape: what the last event of a stream
and a whole answer carry."""
from __future__ import annotations

from ...core.answer import finish_detail, speculative_usage
from ...core.jobs import Job
from ..shared.timings import timings
from .props import generation_settings


def truncated(job: Job) -> bool:
    """Whether generation ended because the context was full (llama-server's `truncated`)."""
    s = job.stats
    return s.finish_reason == "length" and s.n_prompt + s.n_generated >= job.state.engine.n_ctx


def final(job: Job, content: str, tokens: list[int], return_tokens: bool = False, new_line: bool | None = None) -> dict:
    """The last answer object (the whole answer, or a stream's last event). `new_line`: whether the text
    had a line break (a stream's last event has no text of its own)."""
    word = job.stats.stop_word if job.stats.finish_reason == "stop" else ""  # the one that cut the text
    stop_type = "limit" if job.stats.finish_reason == "length" else "word" if word else "eos"
    target, req = job.state.engine.target, job.req
    return {"index": 0, "content": content, "tokens": list(tokens) if return_tokens else [], "id_slot": job.id_slot,
            "stop": True, "model": req.model, "tokens_predicted": job.stats.n_generated,
            "tokens_evaluated": job.stats.n_prompt,
            "generation_settings": generation_settings(req.sampling, req.spec, eog=target.vocab.eog, stream=req.stream,
                                                       n_predict=req.sampling.max_tokens, verify=req.verify),
            "prompt": target.detokenize(job.prompt_tokens, True).decode("utf-8", "replace"),
            "has_new_line": "\n" in content if new_line is None else new_line, "truncated": truncated(job),
            "stop_type": stop_type, "stopping_word": word, "tokens_cached": job.stats.n_cached,
            "timings": timings(job), "speculative": speculative_usage(job), **finish_detail(job.stats)}
