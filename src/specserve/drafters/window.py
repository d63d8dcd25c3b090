"""The draft model's bounded cache (--draft-ctx N): the attention sinks and a recent window.

A draft guesses the next few tokens mostly from the last few hundred; what lies far back is
what the lookup drafters copy for free. So the draft model may keep a cache of N cells instead
of the whole context (MagicDec, TriForce: a StreamingLLM cache, Xiao et al. 2023): the first
N_SINK tokens of the sequence (the attention sinks: the chat template's opening) and the most
recent ones. Its memory and its prompt's prefill then stop growing with the context: a long
prompt is prefilled from where the window starts. Verification is the target's, so the text
is whatever the window (lossless); only acceptance depends on it.

Text index i is held in cell i (i < n_sink) or cell i - gap (i >= n_sink + gap); the text in
between is dropped. When the recent part must move on, it slides `slide` tokens further than
needed (fewer shifts): the oldest recent cells are removed and the rest moved down
(llama.cpp's seq_rm + seq_add, as its context shift and --cache-reuse do: Context.reuse, the
keys re-rotated at the next pass), so that the cells' positions stay 0..n-1 (StreamingLLM's
positions within the cache, not the text's). Where the memory cannot shift, Context.reuse
keeps the prefix only and the window is filled again in one batch. What each choice measured:
docs/draft-window.md.
"""
from __future__ import annotations

from typing import Sequence

from .. import steps
from ..backends.base import Context, MemoryUse, common_prefix
from ..backends.cache_reuse import plan_reuse

N_SINK = 4  # StreamingLLM's attention sinks: Qwen's chat template opens "<|im_start|>system\nYou"


def slide_for(cells: int) -> int:
    """Tokens a slide drops beyond what it must."""
    return max(cells // 16, 8)


class WindowedContext:
    """A draft model's cache of `cells` cells following a sequence of up to `n_ctx` tokens.

    The Context verbs the engine and server use on a draft cache (truncate, memory, t_eval,
    close) are here in text terms; passes run on `inner` (a single context or one sequence of
    a shared one), which the drafter syncs through `sync`.
    """

    def __init__(self, inner: Context, n_ctx: int, n_sink: int = N_SINK):
        self.inner = inner
        self.cells = inner.n_ctx
        self.n_ctx = n_ctx  # the longest sequence it follows (the target's context)
        self.n_sink = n_sink
        self.slide = slide_for(self.cells)
        self.gap = 0  # text tokens dropped after the sinks
        if self.cells < n_sink + 2 * self.slide + 2:
            raise ValueError(f"a draft window of {self.cells} cells is too small")

    @property
    def max_room(self) -> int:
        """The most cells a draft may need beyond the sequence (its tokens after the first)."""
        return self.cells - self.n_sink - 2 * self.slide

    @property
    def t_eval(self) -> float:
        return self.inner.t_eval

    def _plan(self, tokens: Sequence[int], room: int) -> tuple[int, list[int], int]:
        """(gap, what the cells hold for `tokens` with `room` cells free after them, cells a slide
        drops from the cached recent part before the rest is synced; 0: no slide)."""
        n, s, cached = len(tokens), self.n_sink, self.inner.tokens
        need = n + room - self.cells  # text that cannot be held
        if need <= 0 and self.gap == 0:
            return 0, list(tokens), 0
        gap, drop = self.gap, 0
        # the recent part as cached: text from n_sink + gap on, if the sinks still match
        held = common_prefix(cached[s:], tokens[s + gap:]) if common_prefix(cached[:s], tokens[:s]) == s else 0
        if not held:  # nothing recent to keep: fill the window where it is best
            gap = need + self.slide if need > 0 else 0
        elif gap < need:  # slide: the oldest recent tokens go, the rest moves down
            gap = need + self.slide
            drop = gap - self.gap if gap - self.gap < held else 0  # all of it dropped: fill again
        return gap, [*tokens[:s], *tokens[s + gap:]] if gap else list(tokens), drop

    def missing(self, tokens: Sequence[int], room: int, reuse: int = 0) -> int:
        """Tokens `sync` would evaluate for `tokens` (with `room` cells left after them)."""
        _, cells, drop = self._plan(tokens, room)
        cached = self.inner.tokens
        if drop:
            cached = cached[:self.n_sink] + cached[self.n_sink + drop:]
        keep = plan_reuse(cached, cells, reuse)[0] if reuse > 0 and not drop else common_prefix(cached, cells)
        return len(cells) - keep

    def sync(self, tokens: Sequence[int], room: int, reuse: int = 0, logits: bool = True) -> steps.Steps:
        """Make the cells hold the window of `tokens` with `room` cells left after it; return the
        logits after the last token (logits=True; at least that one is evaluated again) or None.
        reuse > 0: --cache-reuse on the cells (where the window did not slide)."""
        gap, cells, drop = self._plan(tokens, room)
        self.gap = gap
        if drop and self.inner.drop(self.n_sink, drop):
            reuse = 0  # the kept part is now a prefix of the cells
        if logits:
            return (yield from steps.sync_and_eval(self.inner, cells, reuse))
        yield from steps.sync_prefix(self.inner, cells, reuse)
        return None

    def truncate(self, n: int) -> None:
        """Keep text [0, n) (or a prefix of it)."""
        if n >= self.n_sink + self.gap:
            self.inner.truncate(n - self.gap)
        else:
            self.inner.truncate(min(n, self.n_sink))
            self.gap = 0

    def memory(self) -> MemoryUse:
        return self.inner.memory()

    def close(self) -> None:
        self.inner.close()


def draft_contexts(model, n_ctx: int, window: int, n_seq: int | None = None, n_batch: int = 512,
                   n_ubatch: int | None = None) -> list:
    """The draft model's caches for a target context of n_ctx tokens (none without a model): one of its
    own (n_seq None) or n_seq sequences of one shared context, each of `window` cells where
    0 < window < n_ctx (the context then holds n_seq x window cells), of n_ctx cells otherwise. None
    where the backend cannot share a context among n_seq sequences. n_ubatch (-ubd): the tokens llama.cpp
    computes at once there (default n_batch); a pass of more (a prompt, a refill) is split into that many."""
    if model is None:
        return [None] * (n_seq or 1)
    cells = window if 0 < window < n_ctx else n_ctx
    shared = None if n_seq is None else model.new_shared_context(cells, n_seq, n_batch, n_ubatch)
    if n_seq is not None and shared is None:
        return None
    ctxs = [model.new_context(cells, n_ubatch=n_ubatch)] if shared is None else shared.seqs
    return [WindowedContext(c, n_ctx) for c in ctxs] if cells < n_ctx else list(ctxs)
