"""The request fields OpenAI's and llama-server's generating endpoints share, and what every adapter
does with them: the profile a `model` names, sampling and speculation (core/params.py), and the fields
this server refuses rather than ignore.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import anyio
from pydantic import field_validator, model_validator

from ....chat import TEMPLATE_OWN, ChatTemplateError
from ....config import SamplingParams, SpecParams, verify_method
from ....prompt import chat_tokens
from ...core.constraints.tools import ToolRequest, template_input
from ...core.params import SAMPLING_FIELDS, SPEC_FIELDS, TokenLimit, sampling_params, spec_params
from ...core.model_presets import Profile
from ...http.errors import bad_request
from .constraint_fields import ConstraintFields
from .logprob_shapes import logit_bias_of
from .validation import Fields

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 256  # characters per stop string


def _one_of(*values) -> Callable[[object], bool]:
    return lambda v: not isinstance(v, bool) and v in values


def _off(v) -> bool:
    return not v


# Fields we do not implement (OpenAI's and llama-server's): refused with `unsupported_parameter`
# unless absent, null, or neutral (what the field means when it is left out). Answering
# while ignoring them would hand back output the client did not ask for.
_UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "n": _one_of(1), "best_of": _one_of(1),
    "echo": _off, "logprobs": _off, "top_logprobs": _off, "suffix": _off,  # logprobs: where the endpoint has them
    "functions": _off, "function_call": _one_of("none", "auto"),  # the deprecated form of tools
    "audio": _off, "modalities": lambda v: v == ["text"], "prediction": _off,
    # llama-server's sampling fields
    "n_probs": _off, "image_data": _off, "multimodal_data": _off,
    "post_sampling_probs": _off, "typical_p": _one_of(1), "mirostat": _off, "dry_multiplier": _off,
    "xtc_probability": _off, "dynatemp_range": _off, "top_n_sigma": lambda v: _one_of(-1)(v) or not v,
    "lora": _off,
    # llama-server's fields for its context shift, which this server does not have
    "n_keep": _one_of(0, -1), "t_max_predict_ms": _off,
}


# why, where the field's name alone does not say it
_WHY = {"mirostat": "its state follows the surprise of each sampled token, which verifying a draft cannot reproduce; "
                    "use temperature, top_k, top_p, min_p"}


def check_unsupported(body: dict, handled: tuple[str, ...] = ()) -> None:
    """400 `unsupported_parameter` for the first field we do not implement that is set to a non-neutral
    value (`handled`: fields of that list the endpoint does implement)."""
    for key, neutral in _UNSUPPORTED.items():
        value = body.get(key) if key not in handled else None
        if value is None or neutral(value):
            continue
        why = f": {_WHY[key]}" if key in _WHY else ""
        raise bad_request(f"{key}={json.dumps(value)[:40]} is not supported by this server{why}", key,
                          "unsupported_parameter")
    for key in SPEC_FIELDS:  # a speculation field sent at the top level would otherwise be ignored
        if body.get(key) is not None:
            raise bad_request(f"{key} is a field of the speculative object: send "
                              f'"speculative": {{"{key}": {json.dumps(body[key])[:40]}}}', key, "unsupported_parameter")


class Speculative(Fields):
    """The `speculative` object (a specserve extension): per-request speculation settings."""

    mode: str | None = None
    draft_max: int | None = None
    draft_min: int | None = None
    draft_p_min: float | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    suffix_max: int | None = None
    cross_request: bool | None = None
    cross_request_scope: str | None = None
    verify: str | None = None
    trace: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, value):
        if not isinstance(value, dict):
            raise bad_request("speculative must be an object", "speculative")
        for key in value:
            if key not in SPEC_FIELDS:
                raise bad_request(f"speculative.{key} is unknown; known: {', '.join(SPEC_FIELDS)}",
                                  f"speculative.{key}")
        return value

    def asked(self) -> dict:
        """The fields set (not null), for core.params.spec_params."""
        return {k: getattr(self, k) for k in SPEC_FIELDS if getattr(self, k) is not None}


class GenerationFields(ConstraintFields):
    """What OpenAI's and llama-server's generating endpoints share: sampling, stop strings, streaming,
    the prompt cache, speculation and output constraints. Unknown fields are left to the endpoint."""

    model: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    samplers: str | list[str] | None = None  # llama-server's chain (core/params.py)
    stop: tuple[str, ...] = ()
    stream: bool | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = None  # llama-server's: run on this slot (slot_id)
    logit_bias: Any = None  # OpenAI's map or llama-server's list (probs.logit_bias_of)
    repeat_penalty: float | None = None  # llama.cpp's penalties (processors.py)
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    speculative: Speculative | None = None

    @field_validator("samplers", mode="before")
    @classmethod
    def _samplers(cls, value):
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise bad_request("samplers must be an array of sampler names or a string of their letters", "samplers")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value) -> tuple[str, ...]:
        if value is None:
            return ()
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad_request("stop must be a string or an array of strings", "stop")
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_LEN for s in stops):
            raise bad_request(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_LEN} characters", "stop")
        return tuple(s for s in stops if s)

    def sampling_asked(self, random_seed: int | None = None) -> dict:
        """The sampling fields set (not null); `random_seed`: the seed value that means a random one
        (llama-server's -1), given as None."""
        asked = {k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None}
        if random_seed is not None and asked.get("seed") == random_seed:
            asked["seed"] = None
        return asked

    # What an API spells its own way, its model overriding these
    def spec_asked(self) -> dict:
        """The speculative fields asked for (core.params.spec_params)."""
        return self.speculative.asked() if self.speculative is not None else {}

    def logprobs_asked(self) -> tuple[int, str] | None:
        """(alternatives per token, logprobs_mode) where the request asks for logprobs."""
        return None

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        """(GenRequest.reasoning_format, GenRequest.reasoning_budget) the request asks for."""
        return None, None

    def format_grammar(self) -> tuple[str, str] | None:
        """(param, grammar) of an output format in the API's own field (constraint_fields.output_grammar)."""
        return None


def template_kwargs_of(value: dict | None, server: dict) -> dict:
    """A request's `chat_template_kwargs` over the server's (--reasoning, --chat-template-kwargs); 400 for
    a variable the renderer gives the template itself."""
    own = TEMPLATE_OWN & set(value or {})
    if own:
        raise bad_request(f"chat_template_kwargs cannot set {', '.join(sorted(own))}", "chat_template_kwargs")
    return {**server, **(value or {})}


def resolve_profile(name: str | None, profiles: dict[str, Profile], default: str) -> Profile:
    """The profile named by `model`; any other name (or none) is the served model's own profile, as
    llama-server serves whatever name a client sends: editors and agents send their own defaults
    (`gpt-4o-mini`, `qwen2.5-coder:1.5b`, `claude-...`)."""
    return profiles.get(name or default) or profiles[default]


@dataclass(frozen=True)
class RequestParams:
    """How a request samples and speculates: its fields over its profile (params_of)."""

    sampling: SamplingParams
    limited_by: str | None  # the field that set max_tokens (GenRequest.limit); None: the context's room
    spec: SpecParams
    verify: str  # the method sampled drafts are verified by (config.verify_method)


def params_of(server, fields: GenerationFields, profile: Profile, limit: TokenLimit | None, *,
              default: TokenLimit | None = None, random_seed: int | None = None) -> RequestParams:
    """How the request samples and speculates over its profile.
    server: builder.ServerView (the target for logit_bias, the context, the draft, the key's scope)."""
    asked = fields.sampling_asked(random_seed)
    if fields.logit_bias is not None:
        asked["logit_bias"], asked["bias_text"] = logit_bias_of(fields.logit_bias, server.target)
    logprobs = fields.logprobs_asked()
    if logprobs is not None:
        asked["logprobs"], asked["logprobs_mode"] = logprobs
    sampling, described = sampling_params(profile, server.n_ctx, asked,
                                          limit=limit, default=default, samplers=fields.samplers, stop=fields.stop)
    spec_p, verify = spec_params(fields.spec_asked(), profile, server.has_draft, server.key_scope)
    # verify `auto` is told apart by the seed
    return RequestParams(sampling, described, spec_p, verify_method(verify, sampling.seed))


def prompt_value(value: Any, key: str = "prompt") -> str | list[int] | None:
    """A prompt: a string or token ids (or a one-element array of either); None if absent."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # OpenAI's batch form with one prompt
    if isinstance(value, str):
        if not value:
            raise bad_request(f"{key} is empty", key)
        return value
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if not value:
            raise bad_request(f"{key} is empty", key)
        return list(value)
    raise bad_request(f"{key} must be a string or an array of token ids (one prompt per request)", key)


def slot_id(id_slot: int | None, n_slots: int) -> int:
    """llama-server's `id_slot`: -1 (any), or a slot of this server, counted round the slots as llama-server
    does (llama.vim sends its request number); 400 for another negative."""
    id_slot = -1 if id_slot is None else id_slot
    if id_slot < -1:
        raise bad_request(f"id_slot must be -1 (any slot) or a slot number, got {id_slot}", "id_slot")
    return id_slot if id_slot < 0 else id_slot % n_slots


def required(value, key: str):
    if value is None:
        raise bad_request(f"{key} is required", key)
    return value


async def count_chat_tokens(model, chat: list[dict], tools: ToolRequest | None, param: str,
                            continue_final: bool = False) -> int:
    """The prompt tokens a chat (and its tools) renders to with the model's template, off the event loop:
    the token counts of /v1/messages and /v1/responses (`continue_final`: its last message is continued).
    A chat the template refuses is a 400 on `param`."""
    def count() -> int:
        try:
            return len(chat_tokens(model, *template_input(model, chat, tools), continue_final))
        except (ChatTemplateError, ValueError) as e:
            raise bad_request(str(e), param) from None
    return await anyio.to_thread.run_sync(count)
