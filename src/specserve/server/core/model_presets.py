"""Named presets a request picks through its `model` field.

`--profile code=spec=draft,draft_max=8` makes "code" a model name: a request for it
gets those speculation and sampling defaults, which its own fields still override.
The served model itself (its alias) is the profile made of the command-line flags,
and every named profile starts from it.

Pinned fields are the ones a request may not change: `pinned=temperature+verify` lists
them (option names, joined with '+'), and a profile that sets a cross_request_scope pins it
without being told. A request that sets a pinned field to another value gets 400
`pinned_parameter`; sending the profile's own value is fine.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...config import DEFAULT_VERIFY, VERIFY_METHODS, SamplingParams, SpecParams, draft_max_caps_suffix

# option name -> (field, group, type); groups: "spec" -> SpecParams, "sampling" -> SamplingParams
_OPTIONS: dict[str, tuple[str, str, type]] = {
    "spec": ("mode", "spec", str), "mode": ("mode", "spec", str),
    "draft_max": ("draft_max", "spec", int), "draft_min": ("draft_min", "spec", int),
    "draft_p_min": ("draft_p_min", "spec", float),
    "ngram_min": ("ngram_min", "spec", int), "ngram_max": ("ngram_max", "spec", int),
    "suffix_max": ("suffix_max", "spec", int), "cross_request": ("cross_request", "spec", bool),
    "cross_request_scope": ("cross_request_scope", "spec", str),
    "temperature": ("temperature", "sampling", float), "temp": ("temperature", "sampling", float),
    "top_k": ("top_k", "sampling", int), "top_p": ("top_p", "sampling", float),
    "min_p": ("min_p", "sampling", float), "seed": ("seed", "sampling", int),
    "max_tokens": ("max_tokens", "sampling", int), "n_predict": ("max_tokens", "sampling", int),
    "ignore_eos": ("ignore_eos", "sampling", bool), "verify": ("verify", "verify", str),
}
PIN_OPTION = "pinned"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True)
class Profile:
    """Defaults for requests that name this profile: keyword overrides, already validated.
    `pinned`: field names (SpecParams', SamplingParams', "verify") requests may not change."""

    name: str
    spec: dict = field(default_factory=dict)  # SpecParams fields
    sampling: dict = field(default_factory=dict)  # SamplingParams fields
    verify: str = DEFAULT_VERIFY
    pinned: frozenset = frozenset()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"profile name {self.name!r} must be letters, digits and ._:/@+- (at most 128)")
        if self.verify not in VERIFY_METHODS:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_METHODS)}, got {self.verify!r}")
        SpecParams(**self.spec)  # raise ValueError now, at startup, not on the first request
        SamplingParams(**{"max_tokens": 1, **self.sampling})
        if self.spec.get("cross_request_scope"):  # a scope the profile sets is pinned by default
            object.__setattr__(self, "pinned", frozenset(self.pinned | {"cross_request_scope"}))

    def describe(self) -> dict:
        return {"speculative": dict(self.spec), "sampling": dict(self.sampling), "verify": self.verify,
                "pinned": sorted(self.pinned)}


def _convert(key: str, value: str, kind: type):
    try:
        if kind is bool:
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError
            return value.lower() in ("1", "true", "yes")
        return kind(value)
    except ValueError:
        raise ValueError(f"{key} must be {kind.__name__}, got {value!r}") from None


def _pinned(name: str, value: str) -> set[str]:
    fields = set()
    for option in filter(None, (s.strip().replace("-", "_") for s in value.split("+"))):
        if option not in _OPTIONS:
            raise ValueError(f"profile {name}: pinned={value}: unknown option {option!r}; known: "
                             f"{', '.join(sorted(_OPTIONS))}")
        fields.add(_OPTIONS[option][0])
    return fields


def parse_profile(text: str, base: Profile) -> Profile:
    """Parse `NAME=key=value,key=value` into a Profile layered on `base`. Raises ValueError."""
    name, sep, options = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--profile wants NAME=key=value,..., got {text!r}")
    spec, sampling, verify, pinned = dict(base.spec), dict(base.sampling), base.verify, set(base.pinned)
    given = set()
    for item in filter(None, (s.strip() for s in options.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if sep and key == PIN_OPTION:
            pinned |= _pinned(name, value)
            continue
        if not sep or key not in _OPTIONS:
            raise ValueError(f"profile {name}: unknown option {item!r}; known: "
                             f"{', '.join(sorted([*_OPTIONS, PIN_OPTION]))}")
        fname, group, kind = _OPTIONS[key]
        value = _convert(key, value.strip(), kind)
        if group == "spec":
            spec[fname] = value
            given.add(fname)
        elif group == "sampling":
            sampling[fname] = value
        else:
            verify = value
    try:
        return Profile(name, draft_max_caps_suffix(spec, given), sampling, verify, frozenset(pinned))
    except ValueError as e:
        raise ValueError(f"profile {name}: {e}") from None


def build_profiles(default: Profile, texts: list[str]) -> dict[str, Profile]:
    """The served model's own profile first, then the named ones; names must be unique."""
    profiles = {default.name: default}
    for text in texts:
        p = parse_profile(text, default)
        if p.name in profiles:
            raise ValueError(f"profile name {p.name!r} is used twice (the served model is {default.name!r})")
        profiles[p.name] = p
    return profiles
