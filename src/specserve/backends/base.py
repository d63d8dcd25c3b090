"""The backend seam: everything the speculative logic needs from a forward-pass engine.

A `Model` holds weights and vocabulary; a `Context` holds one sequence's KV cache.
Several contexts can share one model (server slots). The speculative logic only
ever calls the verbs below, so another engine (PyTorch on a GPU) can be added by
implementing them. `common_prefix` and `sync_prefix` are the cache reuse built on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class VocabInfo:
    """Tokenizer facts used by the pairing check and the engine."""

    vocab_type: str  # "bpe", "spm", "wpm", "ugm", ...
    n_vocab: int
    bos: int | None
    eos: int | None
    eog: frozenset[int]  # every end-of-generation token (eos, eot, ...)
    add_bos: bool
    add_eos: bool
    token_texts: Sequence[str] = field(repr=False, default=())
    token_attrs: Sequence[int] = field(repr=False, default=())


@dataclass(frozen=True)
class MemoryUse:
    """Bytes a loaded model and one of its contexts take, as the engine reports them."""

    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute


class Context(Protocol):
    """One sequence's KV cache on a model. Positions are 0-based and contiguous."""

    n_ctx: int
    t_eval: float  # seconds spent in forward passes so far (what is not this is our own overhead)
    # the context whose passes this sequence shares with others (Model.new_shared_context's); None: a
    # context of its own, whose passes run alone
    shared: PassGroup | None

    @property
    def tokens(self) -> list[int]:
        """The tokens whose keys and values are in the cache, in position order."""
        ...

    def eval(self, tokens: Sequence[int], logits: str = "last") -> np.ndarray:
        """Append `tokens` at the next positions and run one forward pass over them.

        logits="last" returns [1, n_vocab]; "all" returns [len(tokens), n_vocab], row i
        being the distribution of the token after tokens[i]. The array is only valid
        until the next call on this context. Raises ValueError past n_ctx.
        """
        ...

    def truncate(self, n: int) -> None:
        """Keep positions [0, n) in the cache and forget the rest.

        A memory that cannot drop a suffix (recurrent state) is cleared and the kept
        tokens are evaluated again: slow, never wrong. `Model.can_rollback` says which.
        """
        ...

    def reuse(self, tokens: Sequence[int], n_min: int) -> int:
        """Keep the cached prefix of `tokens` and, with n_min > 0, cached runs of >= n_min tokens that
        moved to earlier positions in `tokens`, shifted there (llama-server's --cache-reuse; only where the
        memory can shift positions: cache_reuse.py). The cache then holds tokens[:n]; return n."""
        ...

    def drop(self, start: int, n: int) -> bool:
        """Remove cells [start, start + n) and move the later ones down by n, keys re-rotated (llama.cpp's
        context shift; the draft window's slide). False, nothing changed, where the memory cannot shift."""
        ...

    def memory(self) -> MemoryUse: ...

    def close(self) -> None: ...


class PassGroup(Protocol):
    """Sequences of one context whose tokens go into one forward pass (Model.new_shared_context)."""

    n_batch: int  # the most tokens a pass takes
    can_rollback: bool  # as Model.can_rollback

    def decode(self, parts: Sequence[tuple[Context, Sequence[int], str | None]]) -> list[np.ndarray | None]:
        """One pass over every part's tokens, each appended to its sequence; logits per part as
        Context.eval's ("all", "last"), or None for none. The arrays are valid until the next pass."""
        ...


def pass_group(ctx: Context) -> Context | PassGroup:
    """What `ctx`'s passes run on: the context it is a sequence of, or itself."""
    return ctx.shared if ctx.shared is not None else ctx


class Model(Protocol):
    """Weights and vocabulary, shared by its contexts. A backend's model class subclasses this Protocol
    to take the defaults of the optional abilities (can_rollback, weights_bytes, new_shared_context,
    grammar_tokenizer), so the engine and server ask for them by name, never with getattr."""

    path: str
    vocab: VocabInfo
    n_ctx_train: int
    metadata: dict[str, str]
    can_rollback: bool = True  # whether truncate() is cheap; False for recurrent and hybrid memories
    weights_bytes: int = 0  # bytes its weights take as loaded (0: unknown)

    def new_context(self, n_ctx: int, n_batch: int = 512, n_ubatch: int | None = None) -> Context:
        """One sequence's cache of n_ctx tokens; a pass takes up to n_batch tokens, computed n_ubatch at a
        time (default n_batch): what sizes the engine's working memory for a pass (memory.py)."""
        ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders as (special tokens render empty unless asked)."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> bytes: ...

    def new_shared_context(self, n_ctx: int, n_seq: int, n_batch: int = 512, n_ubatch: int | None = None):
        """n_seq sequences of n_ctx tokens in one context (its `.seqs`, each a Context) whose passes can
        be batched, at most n_batch tokens a pass, n_ubatch at a time as new_context's; None where the
        backend cannot (each server slot then has contexts of its own)."""
        return None

    def grammar_tokenizer(self):
        """The tokenizer a grammar is compiled against (llguidance's), built once and kept; None where
        the backend cannot constrain generation."""
        return None

    def unload(self) -> None:
        """Free the weights (its contexts closed first), keeping path, metadata and vocab readable; the
        server's --sleep-idle-seconds. A backend that cannot raises NotImplementedError."""
        raise NotImplementedError(f"{type(self).__name__} cannot unload its weights")

    def reload(self) -> None:
        """Load the weights again, with the settings they were first loaded with (after `unload`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reload its weights")

    def close(self) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a cache that is a prefix of the sequence), at C speed
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect with slice comparisons
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def sync_prefix(ctx: Context, tokens: Sequence[int]) -> int:
    """Make ctx hold exactly `tokens`, reusing its cached prefix; return how many were cached."""
    keep = common_prefix(ctx.tokens, tokens)
    ctx.truncate(keep)
    if len(tokens) > keep:
        ctx.eval(tokens[keep:], logits="last")
    return keep


def sync_and_eval(ctx: Context, tokens: Sequence[int]) -> np.ndarray:
    """Make ctx hold exactly `tokens` and return the logits after the last one, [n_vocab].

    Reuses the cached prefix; at least the last token is evaluated again so that its
    logits exist.
    """
    keep = min(common_prefix(ctx.tokens, tokens), len(tokens) - 1)
    ctx.truncate(keep)
    return ctx.eval(tokens[keep:], logits="last")[0]
