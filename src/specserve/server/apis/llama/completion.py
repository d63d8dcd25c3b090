"""llama-server's native POST /completion (and /completions), for scripts written against llama.cpp.

Fields: prompt (a string, token ids, both mixed in one array, `{"prompt_string": ...}`, or an array of
such prompts: then the answer is an array), n_predict (-1 or absent: until the context fills),
temperature, top_k, top_p, min_p, seed (-1: random, as in llama-server), stream, stop, ignore_eos,
cache_prompt, id_slot, n_cmpl (or n), return_tokens, response_fields, timings_per_token, grammar (GBNF),
json_schema, response_format (shared/constraint_fields.py), samplers (where they mean what this server does:
core/params.py), and speculation as llama-server spells it (`speculative.n_max`, `speculative.n_min`,
`speculative.p_min`) or as our `speculative` object. The answer carries llama-server's fields
(`content`, `tokens`, `generation_settings`, `prompt`, `tokens_predicted`, `tokens_evaluated`,
`truncated`: the context filled, `stop_type`, `timings` with `draft_n` and `draft_n_accepted`);
`speculative_trace` too where `speculative.trace` asks. Streams send one `data:` object per chunk, the
last with `"stop": true`, and no `[DONE]`, as llama-server does.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import anyio
from pydantic import Field, PrivateAttr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.answer import answer, events
from ...core.events import Text
from ...core.jobs import CLIENT_GONE, Job, start
from ...core.request import GenRequest
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ...http.guard import key_scope
from ..shared import several
from ..shared.answer import stream, traced
from ..shared.builder import Api, Prompt, ServerView, build_request
from ..shared.fields import Generation, prompt_value, required
from ..shared.probs import count, llama_probs, per_token
from ..shared.progress import progress_events
from ..shared.timings import timings
from .answer import final
from .infill_rules import select_fields
from .templates import tokenize_mixed


class LlamaRequest(Generation):
    prompt: Any = None  # llama_prompts()
    n_predict: int | None = None
    max_tokens: int | None = None
    return_tokens: bool | None = None
    timings_per_token: bool | None = None
    return_progress: bool | None = None  # the stream opens with `prompt_progress` events (progress.py)
    n_cmpl: int | None = None
    n: int | None = None  # n_cmpl's other name (OpenAI's)
    response_fields: list[str] | None = None  # only these fields of the answer (infill_rules.select_fields)
    n_probs: int | None = None  # each answer token's logprob and this many alternatives (shared/probs.py)
    logprobs: int | None = None  # n_probs's OpenAI name, read where n_probs is absent (as llama-server does)
    post_sampling_probs: bool | None = None  # probabilities of the distribution sampled from, not the model's
    # llama-server's flat spelling of speculation (llama-server's n_max is our draft_max)
    n_max: int | None = Field(None, alias="speculative.n_max")
    n_min: int | None = Field(None, alias="speculative.n_min")
    p_min: float | None = Field(None, alias="speculative.p_min")

    def spec_asked(self) -> dict:
        """The speculative fields asked for, in either spelling (not both)."""
        flat = {field: v for field, v in (("draft_max", self.n_max), ("draft_min", self.n_min),
                                          ("draft_p_min", self.p_min)) if v is not None}
        if flat and self.speculative is not None:
            raise bad_request("give either the speculative object or speculative.n_max/n_min/p_min, not both",
                              "speculative")
        return flat if self.speculative is None else self.speculative.asked()

    _prompts: list = PrivateAttr(default_factory=list)  # set by llama_prompt

    def logprobs_asked(self) -> tuple[int, str] | None:
        """(alternatives, logprobs_mode) where n_probs (or logprobs) asks for some; 0 asks for none."""
        key, n = ("n_probs", self.n_probs) if self.n_probs is not None else ("logprobs", self.logprobs)
        if n is None or count(n, key) == 0:
            return None
        return n, "processed" if self.post_sampling_probs else "raw"

    @property
    def prompts(self) -> list[str | list[int]]:
        """The body's prompts (llama_prompts), read by its prompt hook: each is a completion of its own."""
        return self._prompts


def routes() -> list[Endpoint]:
    return [Endpoint(path, completion) for path in ("/completion", "/completions")]  # /completions: not OpenAI's


async def llama_prompt(fields: LlamaRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The first of the body's prompts; the endpoint runs the others beside it (fields.prompts)."""
    fields._prompts = await anyio.to_thread.run_sync(llama_prompts, server.target, body.get("prompt"))
    return Prompt(prompt=fields._prompts[0])


LLAMA = Api("llama", LlamaRequest, llama_prompt, limits=("n_predict", "max_tokens"),
            handles=("n", "n_probs", "logprobs", "post_sampling_probs"), random_seed=-1)


def json_prompt(value: dict, param: str) -> str:
    """llama-server's prompt object: {"prompt_string": ..., "multimodal_data": ...}; media is refused."""
    if value.get("multimodal_data"):
        raise bad_request(f"{param}.multimodal_data: this server reads text only", f"{param}.multimodal_data",
                          "unsupported_parameter")
    text = value.get("prompt_string")
    if not isinstance(text, str) or not text:
        raise bad_request(f"{param}.prompt_string must be a non-empty string", f"{param}.prompt_string")
    return text


def one_prompt(model, value, param: str) -> str | list[int]:
    """One prompt: a string, a JSON prompt object, token ids, or strings and token ids mixed."""
    if isinstance(value, dict):
        return json_prompt(value, param)
    if isinstance(value, list) and any(isinstance(v, str) for v in value):
        return tokenize_mixed(model, value, add_special=True, parse_special=True, param=param)
    return required(prompt_value(value, param), param)


def llama_prompts(model, value) -> list[str | list[int]]:
    """The prompts of a body, as llama-server reads them: an array holding arrays or objects, or only
    strings, is several prompts; token ids with or without strings among them are one."""
    if isinstance(value, list) and value and not (any(isinstance(v, int) and not isinstance(v, bool) for v in value)
                                                  and all(isinstance(v, (int, str)) for v in value)):
        return [one_prompt(model, v, f"prompt[{i}]") for i, v in enumerate(value)]
    return [one_prompt(model, value, "prompt")]


async def completion(request: Request) -> Response:
    state = request.app.state.server
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, fields = await build_request(LLAMA, body, ServerView.of(state, key_scope(request.scope)))
    n = several.count(fields.n_cmpl if fields.n_cmpl is not None else fields.n, len(state.scheduler.pool.slots),
                      "n_cmpl" if fields.n_cmpl is not None else "n")
    reqs = [dataclasses.replace(req, prompt=p) for p in fields.prompts]
    if len(reqs) == 1 and n == 1:
        return await _one(request, state, req, fields)
    if req.stream:
        raise bad_request("stream with several prompts or completions is not supported", "stream",
                          "unsupported_parameter")
    runs = [v for r in reqs for v in several.variants(r, n)]
    outs = await several.answers(state, runs, request)
    if outs is None:
        return Response(status_code=CLIENT_GONE)
    per = len(runs) // len(reqs)  # 1 where a greedy request's n completions are one answer
    answers = [_shaped(job, out, fields, i) for i, (job, out) in enumerate(outs) for _ in range(n // per)]
    return JSONResponse([{**a, "index": i} for i, a in enumerate(answers)])


def _shaped(job: Job, out, fields: LlamaRequest, index: int = 0) -> dict:
    body = traced(final(job, out.text, out.tokens, bool(fields.return_tokens)), out.trace)
    if out.logprobs:
        body["completion_probabilities"] = llama_probs(job.state.engine.target, out.logprobs,
                                                       bool(fields.post_sampling_probs))
    return select_fields(body, fields.response_fields) if fields.response_fields else body


async def _one(request: Request, state, req: GenRequest, fields: LlamaRequest) -> Response:
    job = await start(state, req, request)
    if req.stream:
        return stream(request, job, _chunks(job, fields))
    out = await answer(job, request)
    if out is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(_shaped(job, out, fields))


async def _chunks(job: Job, fields: LlamaRequest):
    new_line = False
    if fields.return_progress:
        for progress, times in progress_events(job):
            yield {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": job.id_slot,
                   "tokens_predicted": 0, "tokens_evaluated": job.stats.n_prompt, "prompt_progress": progress,
                   **({"timings": times} if fields.timings_per_token else {})}
    model = job.state.engine.target
    async for event in events(job):
        if event.__class__ is Text:
            new_line = new_line or "\n" in event.text
            pieces = per_token(model, event)
            for i, (text, tokens, rows) in enumerate(pieces):
                chunk = {"index": 0, "content": text, "tokens": tokens, "stop": False,
                         "id_slot": job.id_slot, "tokens_predicted": job.stats.n_generated,
                         "tokens_evaluated": job.stats.n_prompt}
                if rows:
                    chunk["completion_probabilities"] = llama_probs(model, rows, bool(fields.post_sampling_probs))
                if fields.timings_per_token:
                    chunk["timings"] = timings(job)
                yield traced(chunk, event.trace if i == len(pieces) - 1 else None)  # the step's trace once
    await job.finished()
    yield final(job, "", [], new_line=new_line)
