"""Frozen, validated configuration: how to sample and how to speculate.

CLI flags and server request fields map onto these dataclasses; every component
receives only the one it needs. Invalid values raise ValueError with a message
that can be shown to a user as it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

SPEC_MODES = ("auto", "draft", "ngram", "suffix", "none")
SUFFIX_MAX_DEFAULT = 64  # the suffix drafter's own cap: long matches draft far past 8 tokens
# Below this a temperature is greedy: dividing float32 logits by ~1e-40 overflows to inf and the
# distribution becomes NaN. llama.cpp's cut is `temp <= 0`; vLLM's is 1e-5 (_SAMPLING_EPS), taken here.
GREEDY_TEMPERATURE = 1e-5
# Past this a distribution is uniform for any real logits; bigger values are refused, not clamped
# (OpenAI allows [0, 2]; llama-server takes anything, including inf).
MAX_TEMPERATURE = 100.0
SEED_LIMIT = 2**64
# How sampled drafts are verified (verifier.py): gumbel keeps the text a function of the seed
# whatever is speculated; rejection accepts more of a draft model's tokens.
VERIFY_METHODS = ("gumbel", "rejection")
DEFAULT_VERIFY = "gumbel"
# --draft-ctx: the draft model's cache holds the sequence's first tokens and its most recent ones, this many
# cells in all (drafters/window.py; 0: the whole context). Chosen by measurement: docs/draft-window.md.
DRAFT_CTX_DEFAULT = 1024
DRAFT_CTX_MIN = 128  # less leaves too little beside the sinks, a slide and a draft


@dataclass(frozen=True)
class SamplingParams:
    """Token selection for one request. temperature < GREEDY_TEMPERATURE (0 included) means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = disabled
    top_p: float = 1.0  # 1.0 = disabled
    min_p: float = 0.0  # 0.0 = disabled
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    grammar: str | None = None  # an llguidance grammar (specserve.grammar builds them); None: unconstrained
    heal: bytes = b""  # the answer must begin with these bytes, which are not sent (grammar.healing)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be > 0, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


@dataclass(frozen=True)
class SpecParams:
    """How one request speculates.

    mode: auto (the controller picks drafter and length each step), draft (draft model,
    fixed length), ngram (prompt lookup, fixed length), suffix (suffix matching over this
    request and earlier ones, length following the match), none (target alone).
    suffix_max caps the suffix drafter; a draft_max the user sets caps it too (see
    `draft_max_caps_suffix`). cross_request: read and feed the engine's store of earlier
    requests; only requests of the same cross_request_scope see each other's text.
    trace: a server response says, per token, which drafter proposed it or that the target wrote it.
    """

    mode: str = "auto"
    draft_max: int = 8
    draft_min: int = 0
    draft_p_min: float = 0.0
    ngram_min: int = 1
    ngram_max: int = 4
    suffix_max: int = SUFFIX_MAX_DEFAULT
    cross_request: bool = True
    cross_request_scope: str = ""
    trace: bool = False  # the server reports who produced each token (docs/webui.md); generation is the same

    def __post_init__(self) -> None:
        if self.mode not in SPEC_MODES:
            raise ValueError(f"speculative mode must be one of {', '.join(SPEC_MODES)}, got {self.mode!r}")
        if not 0 <= self.draft_max <= 64:
            raise ValueError(f"draft_max must be in [0, 64], got {self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise ValueError(f"draft_min must be in [0, draft_max={self.draft_max}], got {self.draft_min}")
        if not 0 <= self.draft_p_min < 1:
            raise ValueError(f"draft_p_min must be in [0, 1), got {self.draft_p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if not 0 <= self.suffix_max <= 64:
            raise ValueError(f"suffix_max must be in [0, 64], got {self.suffix_max}")
        if len(self.cross_request_scope) > 128:
            raise ValueError("cross_request_scope must be at most 128 characters")


def draft_max_caps_suffix(kw: dict, given) -> dict:
    """SpecParams keywords where a draft_max among the `given` keys also caps the suffix drafter
    (unless suffix_max is given too): an unset draft_max leaves it its own, longer default."""
    if "draft_max" in given and "suffix_max" not in given and kw.get("draft_max") is not None:
        kw = {**kw, "suffix_max": kw["draft_max"]}
    return kw


@dataclass(frozen=True)
class ModelConfig:
    """What to load: a target, an optional draft, and how."""

    target_path: str
    draft_path: str | None = None
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_gpu_layers_draft: int = 0
    n_threads: int | None = None
    auto_profile: bool = True  # keep what --spec auto learns across processes (learned.py)
    cross_request_bytes: int = 0  # the engine's store of earlier requests for the suffix drafter; 0: none
    cache_reuse: int = 0  # --cache-reuse: least run of moved cached tokens a slot keeps (backends/cache_reuse.py); 0: off
    draft_ctx: int = DRAFT_CTX_DEFAULT  # --draft-ctx: the draft model's cache cells a slot (drafters/window.py); 0: n_ctx
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_ctx < 16:
            raise ValueError(f"context size must be >= 16, got {self.n_ctx}")
        if self.n_threads is not None and self.n_threads <= 0:
            raise ValueError(f"threads must be > 0, got {self.n_threads}")
        if self.cross_request_bytes < 0:
            raise ValueError(f"the cross-request store size must be >= 0, got {self.cross_request_bytes}")
        if self.cache_reuse < 0:
            raise ValueError(f"--cache-reuse must be >= 0, got {self.cache_reuse}")
        if self.draft_ctx != 0 and self.draft_ctx < DRAFT_CTX_MIN:
            raise ValueError(f"--draft-ctx must be 0 (the whole context) or >= {DRAFT_CTX_MIN}, got {self.draft_ctx}")
