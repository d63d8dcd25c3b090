"""Frozen, validated configuration: how to sample and how to speculate.

CLI flags and server request fields map onto these dataclasses; every component
receives only the one it needs. Invalid values raise ValueError with a message
that can be shown to a user as it is.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real

SPEC_MODES = ("auto", "draft", "ngram", "suffix", "none")
SUFFIX_MAX_DEFAULT = 64  # the suffix drafter's own cap: long matches draft far past 8 tokens
# Below this a temperature is greedy: dividing float32 logits by ~1e-40 overflows to inf and the
# distribution becomes NaN. llama.cpp's cut is `temp <= 0`; vLLM's is 1e-5 (_SAMPLING_EPS), taken here.
GREEDY_TEMPERATURE = 1e-5
# Past this a distribution is uniform for any real logits; bigger values are refused, not clamped
# (OpenAI allows [0, 2]; llama-server takes anything, including inf).
MAX_TEMPERATURE = 100.0
# the largest finite logit bias (and sum of one token's biases): logits plus it, divided by a repeat penalty and
# tempered, stay finite in float32 (max 3.4e38); anything past it is refused, never rounded to infinity
BIAS_LIMIT = 1e30
MIN_REPEAT_PENALTY = 1e-6  # a positive logit divided by less could pass float32's range
SEED_LIMIT = 2**64
# How sampled drafts are verified (verifier.py): gumbel keeps the text a function of the seed
# whatever is speculated; rejection accepts more of a draft model's tokens (1 - TV a position, against
# at least (1 - TV) / (1 + TV)); auto is gumbel where the request carries a seed and rejection where it
# does not (`verify_method`).
VERIFY_METHODS = ("auto", "gumbel", "rejection")
DEFAULT_VERIFY = "auto"


def verify_method(method: str, seed: int | None) -> str:
    """The method a request's sampled drafts are verified by: `auto` is gumbel for a request with a seed
    (its text is the target alone's for that seed, whatever is drafted) and rejection for one without,
    whose text no seed reproduces anyway: there it keeps more of a draft model's tokens and loses nothing
    it was promised (stories at 0.8, reference pair: 0.59 of single draft tokens kept under gumbel, 0.71
    under rejection; docs/cross-request.md). Both are lossless."""
    if method not in VERIFY_METHODS:
        raise ValueError(f"verify method must be one of {', '.join(VERIFY_METHODS)}, got {method!r}")
    if method == "auto":
        return "gumbel" if seed is not None else "rejection"
    return method


# --draft-ctx: the draft model's cache holds the sequence's first tokens and its most recent ones, this many
# cells in all (drafters/window.py; 0: the whole context). Why 4096, measured: docs/draft-window.md ("The default").
DRAFT_CTX_DEFAULT = 4096
DRAFT_CTX_MIN = 128  # less leaves too little beside the sinks, a slide and a draft
# -ub / -ubd: the tokens llama.cpp computes at once (its n_ubatch), which sizes each context's compute buffer
# (memory.py: activations and logits for that many tokens); longer passes are split into passes of this many.
# The target's on a CPU: prompt speed per CPU-second is flat from 32 to 512 tokens there, and 128 holds a
# verification of the longest draft (65) in one piece (docs/models.md, "The compute buffer and the micro-batch");
# with layers on a GPU (-ngl), llama-server's 512, where larger micro-batches pay for prompt processing.
# The draft's: its steps (at most 10 tokens under --draft-max 8: 8 drafted, the bonus and the last drafted token
# caught up) fit in one pass, and its prompt and window refills (docs/draft-window.md), which go in passes of this
# many, keep their speed: at 64 the draft's prompt prefill runs as fast as at 512 (about 107 tokens per CPU-second),
# at 16 at 0.70-0.87x of it; the buffer is 37.5 MiB on the reference pair (300 MiB at 512, 9.4 at 16;
# docs/models.md, "The compute buffer and the micro-batch").
UBATCH_DEFAULT = 128
UBATCH_GPU_DEFAULT = 512
UBATCH_DRAFT_DEFAULT = 64
# Alternatives a request may ask for at each token (OpenAI's top_logprobs and vLLM's default limit: 20).
MAX_LOGPROBS = 20
# Which distribution logprobs describe (logprobs.py): the model's own softmax, or the one the token was drawn from.
LOGPROBS_MODES = ("raw", "processed")


@dataclass(frozen=True)
class ReasoningBlock:
    """A reasoning block at the start of the answer (`<think>...</think>`, or a template's own markers):
    the tags that open and close it, whether the prompt already opened it (the template starts the
    assistant turn inside it), and its budget in tokens: -1 unlimited; n >= 0 closes it after n
    tokens of reasoning, the close tag then forced (grammar/reasoning.py)."""

    open: str = "<think>"
    close: str = "</think>"
    inside: bool = False
    budget: int = -1

    def __post_init__(self) -> None:
        if not self.open or not self.close:
            raise ValueError("a reasoning block needs its open and close tags")
        if self.budget < -1:
            raise ValueError(f"the reasoning budget must be -1 (unlimited) or >= 0, got {self.budget}")


@dataclass(frozen=True)
class SamplingParams:
    """Token selection for one request. temperature < GREEDY_TEMPERATURE (0 included) means greedy.

    logit_bias: token id -> a bias added to the target's (and the draft's) logits before anything
    else (-inf forbids the token, +inf forces it: only +inf tokens can then be drawn, by their logits); a
    mapping or (id, bias) pairs, kept as sorted pairs (a repeated id adds up, as llama-server's list form
    does). A finite bias (and sum) is at most BIAS_LIMIT either way, which keeps float32 logits finite.
    bias_text: (text, bias) pairs whose text's every token gets the bias (llama-server's text keys):
    tokenized into logit_bias before generation (processors.with_bias_text), off the server's event loop.
    Then llama.cpp's penalties over the last
    `repeat_last_n` tokens of prompt and output (-1: all of them, 0: none): a token seen there c times
    has its logit divided by repeat_penalty (multiplied where <= 0), then lowered by
    c * frequency_penalty + presence_penalty (processors.py). The neutral values cost nothing.
    logprobs: None, or each committed token's log-probability and its `logprobs` most likely
    alternatives (0..MAX_LOGPROBS), of the distribution `logprobs_mode` names (logprobs.py).
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = disabled
    top_p: float = 1.0  # 1.0 = disabled
    min_p: float = 0.0  # 0.0 = disabled
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # an llguidance grammar: its text, or compiled off the event loop (grammar.compiled); None: none
    grammar: object = None
    heal: bytes = b""  # the answer must begin with these bytes, which are not sent (grammar.healing)
    reasoning: ReasoningBlock | None = None  # the answer may begin with a reasoning block; its budget (None: no rule)
    logit_bias: tuple[tuple[int, float], ...] = ()
    bias_text: tuple[tuple[str, float], ...] = ()
    repeat_penalty: float = 1.0  # 1.0 = disabled
    repeat_last_n: int = 64  # llama.cpp's default window
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None = none
    logprobs_mode: str = "raw"

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
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty >= MIN_REPEAT_PENALTY):
            raise ValueError(f"repeat_penalty must be a finite number >= {MIN_REPEAT_PENALTY:g}, got "
                             f"{self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(f"repeat_last_n must be >= -1 (-1: the whole context), got {self.repeat_last_n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -BIAS_LIMIT <= getattr(self, name) <= BIAS_LIMIT:
                raise ValueError(f"{name} must be a finite number from {-BIAS_LIMIT:g} to {BIAS_LIMIT:g}, got "
                                 f"{getattr(self, name)}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}] alternatives, got {self.logprobs}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (llama.cpp's test: a window and a non-neutral value)."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


def _logit_bias(value) -> tuple[tuple[int, float], ...]:
    """SamplingParams.logit_bias as sorted (id, bias) pairs, a repeated id summed; ValueError for what
    cannot be one (an id that is not an integer >= 0, a bias that is not a number, NaN, a finite bias or
    sum past BIAS_LIMIT, a token both forbidden and forced)."""
    try:
        pairs = list(value.items() if isinstance(value, Mapping) else value)
        if not all(len(pair) == 2 for pair in pairs):
            raise TypeError
    except TypeError:
        raise ValueError("logit_bias must map token ids to numbers") from None
    out: dict[int, float] = {}
    for token, bias in pairs:
        if isinstance(token, bool) or not isinstance(token, Integral) or token < 0:
            raise ValueError(f"logit_bias token ids must be integers >= 0, got {token!r}")
        if isinstance(bias, bool) or not isinstance(bias, Real) or not bias_in_range(bias):
            raise ValueError(f"logit_bias values must be numbers from {-BIAS_LIMIT:g} to {BIAS_LIMIT:g}, or -inf "
                             f"(which forbids the token) or +inf (which forces it), got {bias!r}")
        out[int(token)] = out.get(int(token), 0.0) + float(bias)
    for token, bias in out.items():
        if math.isnan(bias):
            raise ValueError(f"logit_bias both forbids (-inf) and forces (+inf) token {token}")
        if not bias_in_range(bias):
            raise ValueError(f"logit_bias adds up to {bias:g} on token {token}: past {BIAS_LIMIT:g}, which float32 "
                             "logits cannot hold finitely under the penalties")
    return tuple(sorted(out.items()))


def bias_in_range(bias: float) -> bool:
    """A logit bias this server takes: ±inf, or a finite number of magnitude at most BIAS_LIMIT."""
    return math.isinf(bias) or -BIAS_LIMIT <= bias <= BIAS_LIMIT


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


def default_ubatch(n_gpu_layers: int) -> int:
    """The target's micro-batch where -ub is not given: a CPU's, or a GPU's where layers are offloaded."""
    return UBATCH_GPU_DEFAULT if n_gpu_layers else UBATCH_DEFAULT


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
    # --cache-reuse: least run of moved cached tokens a slot keeps (backends/cache_reuse.py); 0: off
    cache_reuse: int = 0
    # --draft-ctx: the draft model's cache cells a slot (drafters/window.py); 0: n_ctx
    draft_ctx: int = DRAFT_CTX_DEFAULT
    n_ubatch: int = UBATCH_DEFAULT  # -ub: the target's micro-batch (its compute buffer); see default_ubatch
    n_ubatch_draft: int = UBATCH_DRAFT_DEFAULT  # -ubd: the draft's
    # --exact: the target's passes of any size round as one-token passes do (backends/exact.py)
    exact: bool = False
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
        for flag, n in (("--ubatch-size", self.n_ubatch), ("--ubatch-size-draft", self.n_ubatch_draft)):
            if n < 1:
                raise ValueError(f"{flag} must be >= 1, got {n}")
