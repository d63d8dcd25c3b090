"""The one road from a request body to a GenRequest, for every API: `build_request(api, body, server)`.

What differs between APIs is declared (`Api`): the pydantic model of the body, the fields that limit
generated tokens, the refused fields it does implement, and hooks for its prompt or chat and its tools.
Everything else is done here once, in one order: parse, refuse what is unsupported, the profile, a warm
request, the limit, sampling and speculation over the profile, the slot, the prompt, the tools, the one
grammar, reasoning. The builder reads the server through `ServerView` (what it needs of it: the target
model for tokenizing and templates, the context, the slots, the profiles, the API key's scope, the grammar
worker), never through HTTP, so each API's rules are tested as a table from body to GenRequest.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from starlette.requests import Request

from ....grammar import GrammarWorker
from ...core.constraints.tools import ToolRequest
from ...core.params import SAMPLING_FIELDS, TokenLimit
from ...core.model_presets import Profile
from ...core.request import GenRequest
from ...http.body import read_json
from ...http.errors import bad_request
from ...http.guard import key_scope
from ...state import ServerState, server_of
from .constraint_fields import CONSTRAINT_FIELDS, output_grammar
from .generation_fields import GenerationFields, check_unsupported, params_of, resolve_profile, slot_id
from .validation import parse


@dataclass(frozen=True)
class ServerView:
    """What turning a body into a GenRequest reads of the server."""

    target: Any  # the target model: tokenizer, vocabulary, chat template, FIM tokens
    grammar_tokenizer: Callable[[], Any]  # the target's tokenizer for llguidance (Engine.grammar_tokenizer)
    grammars: GrammarWorker  # compiles grammars off the event loop
    n_ctx: int
    n_slots: int
    has_draft: bool
    profiles: dict[str, Profile]
    model_name: str  # the served model's name: its profile is the default
    key_scope: str | None = None  # the cross-request scope the request's API key confines it to
    aliases: tuple[str, ...] = ()  # the served model's other names (--alias a,b)

    @classmethod
    def of(cls, state: ServerState, key_scope: str | None) -> ServerView:
        """The view of a running server (server/state.py's ServerState) for one request."""
        engine = state.engine
        return cls(engine.target, engine.grammar_tokenizer, state.grammars, engine.n_ctx,
                   state.n_slots, engine.draft is not None, state.profiles,
                   state.settings.model_name, key_scope, state.settings.aliases)


@dataclass(frozen=True)
class Prompt:
    """What a request runs on: a prompt (text or token ids) or a chat, as an API's prompt hook reads it."""

    prompt: str | list[int] | None = None
    messages: list | None = None  # a chat in OpenAI's form, rendered by the model's template
    continue_final: bool = False  # the chat's last (assistant) message is continued
    template_kwargs: dict | None = None  # the request's chat template variables
    heal: bytes | None = None  # a FIM prompt's healed bytes: the answer must begin with them (fim.healed)


# prompt(fields, body, server, max_tokens) -> Prompt
PromptHook = Callable[[Any, dict, ServerView, int], Awaitable[Prompt]]
# tools(fields, body, prompt, target) -> the tools, or None; refuses tools the API does not take
ToolsHook = Callable[[Any, dict, Prompt, Any], ToolRequest | None]


def no_tools(fields, body: dict, prompt: Prompt, target) -> None:
    """Tools are read back from a chat: an API without one refuses them."""
    if body.get("tools") or body.get("tool_choice") not in (None, "none", "auto"):
        raise bad_request("tools are for /v1/chat/completions", "tools", "unsupported_parameter")


@dataclass(frozen=True)
class Api:
    """One API's declaration: what its road from body to GenRequest has of its own."""

    endpoint: str  # GenRequest.endpoint: the metrics label
    fields: type[GenerationFields]  # the body's pydantic model; its methods say what the API spells its own way
    prompt: PromptHook
    limits: tuple[str, ...] = ()  # fields that limit generated tokens: the first one set counts
    default_limit: TokenLimit | None = None  # where neither the request nor its profile gives a limit
    limit_required: bool = False  # a request must give a limit (Anthropic's max_tokens)
    handles: tuple[str, ...] = ()  # fields of the refused list (fields.check_unsupported) this API implements
    random_seed: int | None = None  # the seed that asks for a random one (llama-server's -1)
    warms: bool = False  # `n_predict: 0` puts the prompt in a slot's caches and generates nothing
    # why `speculative.trace` is refused here (None: traced); refused before the prompt is built
    no_trace: str | None = None
    tools: ToolsHook = no_tools
    # the API's own rules on the request built: check(fields, req, server)
    check: Callable[[Any, GenRequest, ServerView], None] | None = None


# What only shapes sampling: a warm request samples nothing, so these are not read (llama.vim's warm-up
# sends its usual samplers, which this server may refuse), as llama-server ignores them there.
WARM_IGNORED = ("samplers", *SAMPLING_FIELDS, "logit_bias", *CONSTRAINT_FIELDS, "n_probs", "logprobs",
                "top_logprobs", "post_sampling_probs", "mirostat", "typical_p", "dry_multiplier", "xtc_probability",
                "dynatemp_range", "top_n_sigma")


def warm_body(body: dict) -> dict:
    """A warm request (`n_predict: 0`) as one generating a single token, its sampling fields left out."""
    return {**{k: v for k, v in body.items() if k not in WARM_IGNORED}, "n_predict": 1}


def limit_of(api: Api, fields) -> TokenLimit | None:
    """The limit on generated tokens from the first of the API's limit fields that the request set;
    `n_predict: -1` is llama-server's "no limit"."""
    for key in api.limits:
        n = getattr(fields, key)
        if n is not None:
            return TokenLimit(key, None) if key == "n_predict" and n == -1 else TokenLimit(key, n)
    if api.limit_required:
        raise bad_request(f"{api.limits[0]} is required", api.limits[0])
    return None


async def build_request(api: Api, body: dict, server: ServerView) -> tuple[GenRequest, Any]:
    """The body as the one GenRequest, and its parsed fields (for what shapes the answer). Raises
    ApiError(400) naming the field for anything it refuses."""
    warm = api.warms and body.get("n_predict") == 0
    if warm:
        body = warm_body(body)
    fields = parse(api.fields, body)
    check_unsupported(body, api.handles)
    profile = resolve_profile(fields.model, server.profiles, server.model_name)
    params = params_of(server, fields, profile, limit_of(api, fields), default=api.default_limit,
                       random_seed=api.random_seed)
    sampling, spec = params.sampling, params.spec
    id_slot = slot_id(fields.id_slot, server.n_slots)
    if spec.trace and api.no_trace:
        raise bad_request(f"speculative.trace is not available on /{api.endpoint}: {api.no_trace}", "speculative.trace",
                          "unsupported_parameter")
    prompt = await api.prompt(fields, body, server, sampling.max_tokens)
    if prompt.heal is not None:
        sampling = dataclasses.replace(sampling, heal=prompt.heal)
    tools = api.tools(fields, body, prompt, server.target)
    grammar = await output_grammar(server, fields, tools, fields.format_grammar())
    if grammar is not None:
        sampling = dataclasses.replace(sampling, grammar=grammar)
    reasoning_format, reasoning_budget = fields.reasoning_asked()
    req = GenRequest(api.endpoint, profile.name, sampling, spec, params.verify, stream=bool(fields.stream),
                     prompt=prompt.prompt, messages=prompt.messages, continue_final=prompt.continue_final,
                     template_kwargs=prompt.template_kwargs, cache_prompt=fields.cache_prompt is not False,
                     limit=params.limited_by, tools=tools, id_slot=id_slot, warm=warm,
                     reasoning_format=reasoning_format, reasoning_budget=reasoning_budget)
    if api.check is not None:
        api.check(fields, req, server)
    return req, fields


async def request_of(api: Api, request: Request) -> tuple[ServerState, GenRequest, Any]:
    """An endpoint's body read (under the server's size and time limits) and built into the one request, under
    the key's scope: (the server's state, the GenRequest, the parsed fields)."""
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    req, fields = await build_request(api, body, ServerView.of(state, key_scope(request.scope)))
    return state, req, fields
