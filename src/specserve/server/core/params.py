"""A request's already-validated values over its profile -> SamplingParams, SpecParams and verify.

The adapters check each field's type and shape (their pydantic models); what is decided here is the
same whichever API a request came by: the profile's defaults and pinned fields, the limit on
generated tokens against the context, llama-server's sampler chain (`samplers`) where it means what
this server does, and the cross-request scope an API key confines a request to. Every refusal is a
400 that names the field.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ...config import GREEDY_TEMPERATURE, SamplingParams, SpecParams, draft_max_caps_suffix
from ..http.errors import ApiError, bad_request
from .model_presets import VERIFY_METHODS, Profile

_SAMPLING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
_SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SpecParams)}
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed", "ignore_eos", "repeat_penalty", "repeat_last_n",
                   "presence_penalty", "frequency_penalty")  # what a request may set by name
PENALTIES = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}  # their neutral values
SPEC_FIELDS = ("mode", "draft_max", "draft_min", "draft_p_min", "ngram_min", "ngram_max", "suffix_max",
               "cross_request", "cross_request_scope", "verify", "trace")  # the `speculative` object's
# llama-server's `samplers` names (and its one-letter forms) -> ours; None: a sampler whose parameters
# are refused unless neutral (DRY, typical-p, XTC, top-n-sigma), so in a chain it does nothing
_SAMPLER_NAMES = {
    "top_k": "top_k", "top-k": "top_k", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p",
    "min_p": "min_p", "min-p": "min_p", "temperature": "temperature", "temp": "temperature",
    "penalties": "penalties", "dry": None, "typ_p": None, "typ-p": None, "typical": None, "typical-p": None,
    "typ": None, "xtc": None, "top_n_sigma": None, "top-n-sigma": None,
}
_SAMPLER_CHARS = {"k": "top_k", "p": "top_p", "m": "min_p", "t": "temperature", "e": "penalties",
                  "d": None, "y": None, "x": None, "s": None}
_SAMPLER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # a sampler left out of the chain is not applied
SAMPLER_ORDER = ("temperature", "top_k", "top_p", "min_p")  # ours (sampling.py)
MAX_TOKENS = 2**31 - 1  # llama-server's bound on n_predict; more than a context holds is cut to what fits


@dataclass(frozen=True)
class TokenLimit:
    """A limit on generated tokens: the field that gave it and its value (None: no limit, llama-server's
    `n_predict: -1`, generate until the context fills)."""

    field: str
    n: int | None


def _samplers(value: str | list[str], kw: dict) -> None:
    """llama-server's `samplers`: the chain to apply, in order (a list of names, or a string of their
    letters). Honoured where it means what this server does: ours that it leaves out are turned off;
    the ones that do something must come in an order that gives what ours gives. Anything else is
    refused (unsupported_parameter)."""
    names, table = (list(value), _SAMPLER_CHARS) if isinstance(value, str) else \
        ([v.lower() for v in value], _SAMPLER_NAMES)
    chain = []
    for name in names:
        if name not in table:
            raise bad_request(f"samplers: {json.dumps(name)[:40]} is not a sampler this server has; it has "
                              f"penalties, {', '.join(SAMPLER_ORDER)} (and takes dry, typ_p, xtc, top_n_sigma "
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
    if "penalties" not in chain:
        kw.update(PENALTIES)
    elif chain[0] != "penalties" and any(kw.get(k, v) != v for k, v in PENALTIES.items()):
        # ours change the logits before anything else (processors.py), as llama-server's default chain does
        raise bad_request("samplers: penalties after another sampler is not supported: this server applies them "
                          "first", "samplers", "unsupported_parameter")
    chain = [name for name in chain if name != "penalties"]
    temperature = kw.get("temperature", _SAMPLING_DEFAULTS["temperature"])
    if "min_p" in chain and chain.index("min_p") < chain.index("temperature") and 0 < kw.get("min_p", 0.0) < 1 \
            and temperature >= GREEDY_TEMPERATURE and temperature != 1:
        # min-p keeps the tokens whose probability is at least min_p x the top one's: a bound on the logit
        # gap, which temperature T scales by 1/T. So min-p p before temperature is min-p p**(1/T) just after
        # it (llama.vim's instruct chain: min_p, temperature)
        kw["min_p"] = kw["min_p"] ** (1 / temperature)
        chain.remove("min_p")
        chain.insert(chain.index("temperature") + 1, "min_p")
    # What must come before what for the values asked: top-k commutes with the rest (it keeps a rank
    # prefix) and so does min-p with top-k; top-p must precede min-p; temperature must precede both,
    # unless it is greedy (all of them keep the argmax) or 1.
    if temperature < GREEDY_TEMPERATURE:
        return
    active = {"top_p": kw.get("top_p", 1.0) < 1, "min_p": kw.get("min_p", 0.0) > 0, "temperature": temperature != 1}
    for first, then in (("top_p", "min_p"), ("temperature", "top_p"), ("temperature", "min_p")):
        if active[first] and active[then] and chain.index(first) > chain.index(then):
            raise bad_request(f"samplers: {then} before {first} is not supported with these values: this server "
                              f"applies {', '.join(SAMPLER_ORDER)} in that order", "samplers", "unsupported_parameter")


def _check_pinned(profile: Profile, kw: dict, asked: dict, limit: TokenLimit | None) -> None:
    """400 `pinned_parameter` where the request changed a sampling field its profile pins."""
    for name in profile.pinned:
        if name == "max_tokens":
            if limit is not None and kw.get("max_tokens") != profile.sampling.get("max_tokens"):
                raise _pinned(profile, limit.field)
        elif name in _SAMPLING_DEFAULTS:
            if kw.get(name, _SAMPLING_DEFAULTS[name]) != profile.sampling.get(name, _SAMPLING_DEFAULTS[name]):
                raise _pinned(profile, name if name in asked else "samplers")


def _pinned(profile: Profile, param: str) -> ApiError:
    return bad_request(f"{param} is pinned by the profile {profile.name!r}: a request cannot change it", param,
                       "pinned_parameter")


def sampling_params(profile: Profile, n_ctx: int, asked: dict, *, limit: TokenLimit | None = None,
                    default: TokenLimit | None = None, samplers: str | list[str] | None = None,
                    stop: tuple[str, ...] = ()) -> tuple[SamplingParams, str | None]:
    """SamplingParams over the profile's defaults, and what set max_tokens (GenRequest.limit).

    asked: the SAMPLING_FIELDS the request set (a `seed` of None: a random one, llama-server's -1);
    limit: the request's limit on generated tokens, if it gave one; default: the API's limit where
    neither the request nor the profile gives one (OpenAI completions' 16). Without any limit,
    generate until the context fills."""
    kw = {**profile.sampling, **asked}
    if samplers is not None:
        _samplers(samplers, kw)
    described = f"max_tokens={kw['max_tokens']} (the default of profile {profile.name!r})" if "max_tokens" in kw \
        else None
    if limit is not None:
        if limit.n is None:
            kw.pop("max_tokens", None)
            described = None
        else:
            if limit.n > MAX_TOKENS:
                raise bad_request(f"{limit.field} must be at most {MAX_TOKENS}, got {limit.n}", limit.field)
            kw["max_tokens"] = limit.n  # past the context: cut to what fits (request.fit_context)
            described = f"{limit.field}={limit.n}"
    _check_pinned(profile, kw, asked, limit)
    if "max_tokens" not in kw and default is not None:
        kw["max_tokens"] = default.n
        described = f"{default.field}={default.n} (the default)"
    kw.setdefault("max_tokens", n_ctx)
    if kw["max_tokens"] <= 0:
        field = limit.field if limit is not None else "max_tokens"
        raise bad_request(f"{field} must be > 0, got {kw['max_tokens']}", field)
    kw["stop"] = stop
    try:
        return SamplingParams(**kw), described
    except ValueError as e:
        raise bad_request(str(e), str(e).split()[0]) from None


def spec_params(asked: dict, profile: Profile, has_draft: bool,
                key_scope: str | None = None) -> tuple[SpecParams, str]:
    """SpecParams and the verify method from the `speculative` fields a request set (SPEC_FIELDS,
    type-checked, None values left out) over the profile's defaults. A field the profile pins may not
    be changed (400 `pinned_parameter`); `key_scope`, the scope the request's API key confines it to,
    replaces cross_request_scope whatever the profile or request says."""
    kw, verify = dict(profile.spec), profile.verify
    for key, value in asked.items():
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
        spec = SpecParams(**draft_max_caps_suffix(kw, list(asked)))
    except ValueError as e:
        raise bad_request(str(e), "speculative") from None
    if spec.mode == "draft" and not has_draft:
        raise bad_request("speculative mode 'draft' needs a draft model; this server has none", "speculative.mode")
    return spec, verify
