"""Request bodies -> validated generation requests.

Everything a client sends is checked here, field by field, so a bad input is a 400
(or 404, 413) that names the field, never an exception deeper in the engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.requests import Request

from ..config import SamplingParams, SpecParams, draft_max_caps_suffix
from .errors import ApiError, bad_request
from .profiles import VERIFY_METHODS, Profile

MAX_STOP = 16  # stop strings per request
MAX_STOP_LEN = 256  # characters per stop string
_SEED_LIMIT = 2**64
_SPEC_FIELDS = {"mode": str, "draft_max": int, "draft_min": int, "draft_p_min": float,
                "ngram_min": int, "ngram_max": int, "suffix_max": int, "cross_request": bool,
                "cross_request_scope": str, "verify": str}
# Fields we do not implement: refused unless absent, null, or neutral (1 for the counts, falsy for the rest).
_ONE_ONLY = ("n", "best_of")
_OFF_ONLY = ("echo", "logprobs", "top_logprobs", "suffix", "logit_bias", "presence_penalty", "frequency_penalty",
             "tools")


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


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object: 413 past `limit` bytes, 400 for bad UTF-8 or JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8: {e.reason} at byte {e.start}",
                          code="invalid_encoding") from None
    except (ValueError, RecursionError) as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from None
    try:  # JSON escapes can spell lone surrogates (\ud800), which no tokenizer takes
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


def check_unsupported(body: dict) -> None:
    for key in _ONE_ONLY + _OFF_ONLY:
        value = body.get(key)
        if value is None or (value == 1 if key in _ONE_ONLY else not value):
            continue
        raise bad_request(f"{key}={json.dumps(value)[:40]} is not supported by this server", key,
                          "unsupported_parameter")


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


def sampling_params(body: dict, profile: Profile, n_ctx: int,
                    max_keys: tuple[str, ...] = ("max_tokens",)) -> SamplingParams:
    """SamplingParams from the body over the profile's defaults. Without a limit, generate until the context fills."""
    kw = dict(profile.sampling)
    for key in ("temperature", "top_p", "min_p"):
        if body.get(key) is not None:
            kw[key] = get(body, key, float)
    for key in ("top_k", "seed"):
        if body.get(key) is not None:
            kw[key] = get(body, key, int)
    if body.get("ignore_eos") is not None:
        kw["ignore_eos"] = get(body, "ignore_eos", bool)
    for key in max_keys:
        n = get(body, key, int)
        if n is not None:
            if n == -1 and key == "n_predict":  # llama-server: -1 = no limit
                kw.pop("max_tokens", None)
                break
            if n > n_ctx:
                raise bad_request(f"{key}={n} is more than the context size ({n_ctx} tokens)", key)
            kw["max_tokens"] = n
            break
    kw.setdefault("max_tokens", n_ctx)
    if kw.get("seed") is not None and not 0 <= kw["seed"] < _SEED_LIMIT:
        raise bad_request(f"seed must be in [0, 2^64), got {kw['seed']}", "seed")
    if kw.get("max_tokens", 1) <= 0:
        raise bad_request(f"{max_keys[0]} must be > 0, got {kw['max_tokens']}", max_keys[0])
    kw["stop"] = _stop(body)
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise bad_request(str(e), str(e).split()[0]) from None


def spec_params(overrides: dict | None, profile: Profile, has_draft: bool) -> tuple[SpecParams, str]:
    """SpecParams and the verify method from a `speculative` object over the profile's defaults."""
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
        if key == "verify":
            verify = value
        else:
            kw[key] = value
    if verify not in VERIFY_METHODS:
        raise bad_request(f"speculative.verify must be one of {', '.join(VERIFY_METHODS)}", "speculative.verify")
    try:
        spec = SpecParams(**draft_max_caps_suffix(kw, [k for k, v in overrides.items() if v is not None]))
    except ValueError as e:
        raise bad_request(str(e), "speculative") from None
    if spec.mode == "draft" and not has_draft:
        raise bad_request("speculative mode 'draft' needs a draft model; this server has none", "speculative.mode")
    return spec, verify


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
