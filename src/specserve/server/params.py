"""Request bodies -> validated generation requests.

Everything a client sends is checked here, field by field, so a bad input is a 400
(or 404, 413) that names the field, never an exception deeper in the engine.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from starlette.requests import Request

from ..chat import MessageError, validate_messages
from ..config import GREEDY_TEMPERATURE, SamplingParams, SpecParams, draft_max_caps_suffix
from .errors import ApiError, bad_request
from .guard import KEY_SCOPE  # noqa: F401 - re-exported for the endpoints
from .profiles import VERIFY_METHODS, Profile

if TYPE_CHECKING:
    from .tools import ToolRequest

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 256  # characters per stop string
COMPLETIONS_MAX_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's default
_SPEC_FIELDS = {"mode": str, "draft_max": int, "draft_min": int, "draft_p_min": float,
                "ngram_min": int, "ngram_max": int, "suffix_max": int, "cross_request": bool,
                "cross_request_scope": str, "verify": str, "trace": bool}
_SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SpecParams)}
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the JSON escape of a UTF-16 surrogate: \ud800-\udfff


def _one_of(*values) -> Callable[[object], bool]:
    return lambda v: not isinstance(v, bool) and v in values


def _off(v) -> bool:
    return not v


# Fields we do not implement (OpenAI's and llama-server's): refused with `unsupported_parameter`
# unless absent, null, or neutral (what the field means when it is left out). Answering
# while ignoring them would hand back output the client did not ask for.
_UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "n": _one_of(1), "best_of": _one_of(1),
    "echo": _off, "logprobs": _off, "top_logprobs": _off, "suffix": _off, "logit_bias": _off,
    "presence_penalty": _off, "frequency_penalty": _off,
    "functions": _off, "function_call": _one_of("none", "auto"),  # the deprecated form of tools
    "audio": _off, "modalities": lambda v: v == ["text"], "prediction": _off,
    # llama-server's sampling fields
    "n_probs": _off, "image_data": _off, "multimodal_data": _off,
    "repeat_penalty": _one_of(1), "typical_p": _one_of(1), "mirostat": _off, "dry_multiplier": _off,
    "xtc_probability": _off, "dynatemp_range": _off, "top_n_sigma": lambda v: _one_of(-1)(v) or not v,
    "lora": _off,
    # llama-server fields for its slots and context shift, which this server does not have
    # (id_slot: /completion and /infill implement it and skip this entry)
    "id_slot": _one_of(-1), "n_keep": _one_of(0, -1), "t_max_predict_ms": _off,
}
_CONTENT_PARTS = ("text",)  # chat content part types understood; images, audio and files are not


@dataclass(frozen=True)
class GenRequest:
    """One generation request, validated: what to run and how to answer."""

    endpoint: str  # "completions", "chat", "llama"
    model: str  # the name the client asked for (a profile name)
    sampling: SamplingParams
    spec: SpecParams
    verify: str
    stream: bool
    prompt: str | list[int] | None = None
    messages: list | None = None
    include_usage: bool = False
    cache_prompt: bool = True  # reuse the slot's cached prefix of the prompt (llama-server's field)
    # what set sampling.max_tokens, for the context check ("max_tokens=100"); None: nothing did, and
    # generation runs until the context fills
    limit: str | None = None
    tools: ToolRequest | None = None  # the request's tools: passed to the template, calls read back
    id_slot: int = -1  # llama-server's: run on this slot, waiting for it if busy; -1: the best free one


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The raw body: 413 past `limit` bytes, 408 if it takes over `timeout` seconds."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    return bytes(body)


async def read_json(request: Request, limit: int, timeout: float) -> dict:
    """The body as a JSON object: 413 past `limit` bytes, 415 unless sent as JSON (a browser cannot
    send that cross-origin without a preflight), 408 if it takes over `timeout` seconds, 400 for
    bad UTF-8 or JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"the body must be sent as 'Content-Type: application/json', not {media_type or 'none'} "
                            "(curl: --json, or -H 'Content-Type: application/json')", code="unsupported_media_type")
    body = await read_body(request, limit, timeout)
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e.reason} at byte {e.start}",
                          code="invalid_encoding") from None
    except (ValueError, RecursionError) as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    try:  # JSON escapes can spell lone surrogates (\ud800), which no tokenizer takes; only a body that
        # has such an escape is checked whole (the check took 127 ms of the event loop for a 450 KB schema)
        if _SURROGATE_ESCAPE.search(body):
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("request body contains an unpaired surrogate escape (\\udXXX): not valid Unicode text",
                          code="invalid_encoding") from None
    if not isinstance(obj, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return obj


def get(body: dict, key: str, kind: type, default=None, param: str | None = None):
    """body[key] checked against `kind` (int, float, bool, str, list, dict); absent or null -> default."""
    value = body.get(key)
    if value is None:
        return default
    param = param or key
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
                list: "an array", dict: "an object"}[kind]
        raise bad_request(f"{param} must be {name}, got {json.dumps(value)[:80]}", param)
    return value


def check_unsupported(body: dict, handled: tuple[str, ...] = ()) -> None:
    """400 `unsupported_parameter` for the first field we do not implement that is set to a non-neutral
    value (`handled`: fields of that list the endpoint does implement)."""
    for key, neutral in _UNSUPPORTED.items():
        value = body.get(key) if key not in handled else None
        if value is None or neutral(value):
            continue
        raise bad_request(f"{key}={json.dumps(value)[:40]} is not supported by this server", key,
                          "unsupported_parameter")
    for key in _SPEC_FIELDS:  # a speculation field sent at the top level would otherwise be ignored
        if body.get(key) is not None:
            raise bad_request(f"{key} is a field of the speculative object: send "
                              f'"speculative": {{"{key}": {json.dumps(body[key])[:40]}}}', key, "unsupported_parameter")


def check_content_parts(messages: list) -> None:
    """400 `unsupported_parameter` for a chat content part that is not text (an image would be dropped)."""
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _CONTENT_PARTS:
                raise bad_request(f"content parts of type {json.dumps(kind)[:40]} are not supported: this server "
                                  "reads text only", f"messages[{i}].content[{j}]", "unsupported_parameter")


def check_messages(messages) -> None:
    """400 naming the field for what OpenAI refuses too: a role that is not one of OpenAI's,
    missing content, non-text content parts, malformed tool calls."""
    if isinstance(messages, list):
        check_content_parts(messages)
    try:
        validate_messages(messages)
    except MessageError as e:
        raise bad_request(str(e), e.param, e.code) from None


def resolve_profile(body: dict, profiles: dict[str, Profile], default: str) -> Profile:
    """The profile named by `model` (the served model when absent); 404 for unknown names."""
    name = get(body, "model", str) or default
    if name not in profiles:
        raise ApiError(404, f"The model `{name}` does not exist. This server serves: {', '.join(profiles)}",
                       "model", "model_not_found")
    return profiles[name]


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_LEN for s in stops):
        raise bad_request(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_LEN} characters", "stop")
    return tuple(s for s in stops if s)


_SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
# llama-server's `samplers` names (and its one-letter forms) -> ours; None: a sampler whose parameters
# are refused unless neutral (penalties, DRY, typical-p, XTC, top-n-sigma), so in a chain it does nothing
_SAMPLER_NAMES = {
    "top_k": "top_k", "top-k": "top_k", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p",
    "min_p": "min_p", "min-p": "min_p", "temperature": "temperature", "temp": "temperature",
    "penalties": None, "dry": None, "typ_p": None, "typ-p": None, "typical": None, "typical-p": None,
    "typ": None, "xtc": None, "top_n_sigma": None, "top-n-sigma": None,
}
_SAMPLER_CHARS = {"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature",
                  "e": None, "d": None, "y": None, "x": None, "s": None}
_SAMPLER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # a sampler left out of the chain is not applied
SAMPLER_ORDER = ("temperature", "top_k", "top_p", "min_p")  # ours (sampling.py)


def _samplers(body: dict, kw: dict) -> None:
    """llama-server's `samplers`: the chain to apply, in order. Honoured where it means what this
    server does: ours that it leaves out are turned off; the ones that do something must come in
    an order that gives what ours gives. Anything else is refused (unsupported_parameter)."""
    value = body.get("samplers")
    if value is None:
        return
    if isinstance(value, str):
        names, table = list(value), _SAMPLER_CHARS
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names, table = [v.lower() for v in value], _SAMPLER_NAMES
    else:
        raise bad_request("samplers must be an array of sampler names or a string of their letters", "samplers")
    chain = []
    for name in names:
        if name not in table:
            raise bad_request(f"samplers: {json.dumps(name)[:40]} is not a sampler this server has; it has "
                              f"{', '.join(SAMPLER_ORDER)} (and takes penalties, dry, typ_p, xtc, top_n_sigma "
                              "while their parameters are neutral)", "samplers", "unsupported_parameter")
        ours = table[name]
        if ours is not None:
            if ours in chain:
                raise bad_request(f"samplers: {ours} is listed twice", "samplers", "unsupported_parameter")
            chain.append(ours)
    if "temperature" not in chain:
        raise bad_request("samplers without temperature (which llama-server then samples at 1, whatever "
                          "`temperature` says) are not supported", "samplers", "unsupported_parameter")
    for name, off in _SAMPLER_OFF.items():
        if name not in chain:
            kw[name] = off
    # What must come before what for the values asked: top-k commutes with the rest (it keeps a rank
    # prefix) and so does min-p with top-k; top-p must precede min-p; temperature must precede both,
    # unless it is greedy (all of them keep the argmax) or 1.
    temperature = kw.get("temperature", _SAMPLING_DEFAULTS["temperature"])
    if temperature < GREEDY_TEMPERATURE:
        return
    active = {"top_p": kw.get("top_p", 1.0) < 1, "min_p": kw.get("min_p", 0.0) > 0, "temperature": temperature != 1}
    for first, then in (("top_p", "min_p"), ("temperature", "top_p"), ("temperature", "min_p")):
        if active[first] and active[then] and chain.index(first) > chain.index(then):
            raise bad_request(f"samplers: {then} before {first} is not supported with these values: this server "
                              f"applies {', '.join(SAMPLER_ORDER)} in that order", "samplers", "unsupported_parameter")


def _check_pinned(profile: Profile, kw: dict, body: dict, limit_key: str | None) -> None:
    """400 `pinned_parameter` where the request changed a sampling field its profile pins."""
    for name in profile.pinned:
        if name == "max_tokens":
            if limit_key is not None and kw.get("max_tokens") != profile.sampling.get("max_tokens"):
                raise _pinned(profile, limit_key)
        elif name in _SAMPLING_DEFAULTS:
            if kw.get(name, _SAMPLING_DEFAULTS[name]) != profile.sampling.get(name, _SAMPLING_DEFAULTS[name]):
                raise _pinned(profile, name if body.get(name) is not None else "samplers")


def _pinned(profile: Profile, param: str) -> ApiError:
    return bad_request(f"{param} is pinned by the profile {profile.name!r}: a request cannot change it", param,
                       "pinned_parameter")


def sampling_params(body: dict, profile: Profile, n_ctx: int, max_keys: tuple[str, ...] = ("max_tokens",),
                    random_seed: int | None = None,
                    default_max: int | None = None) -> tuple[SamplingParams, str | None]:
    """SamplingParams from the body over the profile's defaults, and what set max_tokens (for the
    context check: GenRequest.limit). Without a limit (from the request, the profile or `default_max`),
    generate until the context fills. `random_seed`: a seed value that means "no seed" (llama-server's -1)."""
    kw = dict(profile.sampling)
    for key in ("temperature", "top_p", "min_p"):
        if body.get(key) is not None:
            kw[key] = get(body, key, float)
    for key in ("top_k", "seed"):
        if body.get(key) is not None:
            kw[key] = get(body, key, int)
    if random_seed is not None and body.get("seed") == random_seed:
        kw["seed"] = None
    if body.get("ignore_eos") is not None:
        kw["ignore_eos"] = get(body, "ignore_eos", bool)
    _samplers(body, kw)
    limit = f"max_tokens={kw['max_tokens']} (the default of profile {profile.name!r})" if "max_tokens" in kw else None
    limit_key = None
    for key in max_keys:
        n = get(body, key, int)
        if n is not None:
            limit_key = key
            if n == -1 and key == "n_predict":  # llama-server: -1 = no limit
                kw.pop("max_tokens", None)
                limit = None
                break
            if n > n_ctx:
                raise bad_request(f"{key}={n} is more than the context size ({n_ctx} tokens)", key,
                                  "context_length_exceeded")
            kw["max_tokens"] = n
            limit = f"{key}={n}"
            break
    _check_pinned(profile, kw, body, limit_key)
    if "max_tokens" not in kw and default_max is not None:
        kw["max_tokens"] = default_max
        limit = f"{max_keys[0]}={default_max} (the default)"
    kw.setdefault("max_tokens", n_ctx)
    if kw.get("max_tokens", 1) <= 0:
        raise bad_request(f"{max_keys[0]} must be > 0, got {kw['max_tokens']}", max_keys[0])
    kw["stop"] = _stop(body)
    try:
        return SamplingParams(**kw), limit
    except ValueError as e:
        raise bad_request(str(e), str(e).split()[0]) from None


def spec_params(overrides: dict | None, profile: Profile, has_draft: bool,
                key_scope: str | None = None) -> tuple[SpecParams, str]:
    """SpecParams and the verify method from a `speculative` object over the profile's defaults.
    A field the profile pins may not be changed (400 `pinned_parameter`); `key_scope`, the scope the
    request's API key confines it to, replaces cross_request_scope whatever the profile or request says."""
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, dict):
        raise bad_request("speculative must be an object", "speculative")
    kw, verify = dict(profile.spec), profile.verify
    for key in overrides:
        if key not in _SPEC_FIELDS:
            raise bad_request(f"speculative.{key} is unknown; known: {', '.join(_SPEC_FIELDS)}", f"speculative.{key}")
        value = get(overrides, key, _SPEC_FIELDS[key], param=f"speculative.{key}")
        if value is None:
            continue
        current = verify if key == "verify" else kw.get(key, _SPEC_DEFAULTS[key])
        if key == "cross_request_scope" and key_scope is not None:
            if value != key_scope:
                raise bad_request("speculative.cross_request_scope is set by this request's API key: a request "
                                  "cannot change it", "speculative.cross_request_scope", "pinned_parameter")
        elif key in profile.pinned and value != current:
            raise _pinned(profile, f"speculative.{key}")
        if key == "verify":
            verify = value
        else:
            kw[key] = value
    if key_scope is not None:
        kw["cross_request_scope"] = key_scope
    if verify not in VERIFY_METHODS:
        raise bad_request(f"speculative.verify must be one of {', '.join(VERIFY_METHODS)}", "speculative.verify")
    try:
        spec = SpecParams(**draft_max_caps_suffix(kw, [k for k, v in overrides.items() if v is not None]))
    except ValueError as e:
        raise bad_request(str(e), "speculative") from None
    if spec.mode == "draft" and not has_draft:
        raise bad_request("speculative mode 'draft' needs a draft model; this server has none", "speculative.mode")
    return spec, verify


def check_context(req: GenRequest, n_prompt: int, n_ctx: int) -> None:
    """400 `context_length_exceeded` (OpenAI's answer) when the prompt and the tokens asked for
    cannot both fit the context. Without a limit asked for, generation runs until the context fills."""
    if req.limit is None or n_prompt + req.sampling.max_tokens <= n_ctx:
        return
    n = req.sampling.max_tokens
    field = "messages" if req.messages is not None else "prompt"
    raise bad_request(f"This model's maximum context length is {n_ctx} tokens. However, you requested {n_prompt + n} "
                      f"tokens ({n_prompt} in the {field}, {n} for the completion: {req.limit}). Please reduce the "
                      f"length of the {field} or of the completion.", field, "context_length_exceeded")


def completion_prompt(body: dict, key: str = "prompt") -> str | list[int]:
    """A prompt: a string or token ids (or a one-element array of either)."""
    prompt = body.get(key)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI's batch form with one prompt
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request(f"{key} is empty", key)
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not prompt:
            raise bad_request(f"{key} is empty", key)
        return list(prompt)
    if prompt is None:
        raise bad_request(f"{key} is required", key)
    raise bad_request(f"{key} must be a string or an array of token ids (one prompt per request)", key)
