"""llama-server's generating APIs as declarations (shared/builder.py's Api): /completion (LLAMA: its prompts,
read as llama-server reads them) and /infill (INFILL: the model's FIM layout of the body, greedy for the
`infill` sampler, no constraints, its own n_cmpl and trace rules)."""
from __future__ import annotations

import anyio

from ....fim import Infill, healed
from ...core.request import GenRequest
from ...http.errors import bad_request
from ..shared import n_completions
from ..shared.builder import Api, Prompt, ServerView
from ..shared.constraint_fields import refuse_constraints
from ..shared.generation_fields import prompt_value, required
from ..shared.fim_prompts import fim_prompt
from .protocol import InfillRequest, LlamaRequest
from .templates import tokenize_mixed


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


async def infill_prompt(fields: InfillRequest, body: dict, server: ServerView, max_tokens: int) -> Prompt:
    """The model's FIM layout of the body (fim.py), its cursor's line healed."""
    infill = Infill(prefix=fields.input_prefix or "", suffix=fields.input_suffix or "", prompt=fields.prompt or "",
                    extra=fields.input_extra)
    tokens = await anyio.to_thread.run_sync(fim_prompt, server.target, infill, server.n_ctx, fields.n_predict or 0)
    tokens, heal = healed(server.target, tokens, infill)
    return Prompt(prompt=tokens, heal=heal)


def infill_constraints(fields: InfillRequest, body: dict, prompt: Prompt, target) -> None:
    refuse_constraints(body, fields, "infill")


MAX_GREEDY_COPIES = 16  # n_cmpl of a greedy request: copies of one generation, on a server of fewer slots


def check_infill(fields: InfillRequest, req: GenRequest, server: ServerView) -> None:
    """n_cmpl from 1 to the server's slots (sampled completions each run on one), or to MAX_GREEDY_COPIES
    for a greedy request (one generation copied); one where the answer is streamed."""
    n_slots = server.n_slots
    n_completions.count(fields.n_cmpl, max(n_slots, MAX_GREEDY_COPIES) if req.sampling.greedy else n_slots, "n_cmpl",
                  req.stream)


INFILL = Api("infill", InfillRequest, infill_prompt, limits=("n_predict", "max_tokens"), handles=("t_max_predict_ms",),
             random_seed=-1, warms=True, tools=infill_constraints, check=check_infill,
             no_trace="its line rules cut the text after generation, so a trace would not match it")
