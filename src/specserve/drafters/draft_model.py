"""A small draft model with its own KV cache, kept in step with the accepted sequence.

The cache is synchronised lazily at each proposal: whatever part of it still matches
the committed sequence is kept, the rest is truncated, and the missing tokens (a
bonus or recovered token, the last accepted draft token) are caught up in one batch.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backends.base import Context, Model
from ..config import SamplingParams
from ..sampling import process, sample, softmax
from .base import EMPTY_DRAFT, Draft


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sync_prefix(ctx: Context, tokens: Sequence[int]) -> int:
    """Make ctx hold exactly `tokens`, reusing its cached prefix; return how many were cached."""
    keep = common_prefix(ctx.tokens, tokens)
    ctx.truncate(keep)
    if len(tokens) > keep:
        ctx.eval(tokens[keep:], logits="last")
    return keep


def sync_and_eval(ctx: Context, seq: Sequence[int]) -> np.ndarray:
    """Make ctx hold exactly seq and return the logits after its last token, [n_vocab].

    Reuses the cached prefix; at least the last token is evaluated again so that its
    logits exist.
    """
    keep = min(common_prefix(ctx.tokens, seq), len(seq) - 1)
    ctx.truncate(keep)
    return ctx.eval(seq[keep:], logits="last")[0]


class DraftModelDrafter:
    name = "draft"

    def __init__(self, model: Model, ctx: Context, p_min: float = 0.0, draft_min: int = 0):
        self.model = model
        self.ctx = ctx  # owned by the caller: it outlives one request and keeps its prefix
        self.p_min = p_min
        self.draft_min = draft_min

    def missing(self, seq: Sequence[int]) -> int:
        """Tokens of seq[:-1] its cache lacks (what a prefill would evaluate)."""
        return len(seq) - 1 - common_prefix(self.ctx.tokens, seq[:-1])

    def prefill(self, seq: Sequence[int]) -> None:
        """Take the prompt (all but its last token, which the first proposal evaluates) in one batch."""
        sync_prefix(self.ctx, seq[:-1])

    def propose(self, seq: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        k = min(k, self.ctx.n_ctx - len(seq))
        if k <= 0:
            return EMPTY_DRAFT
        logits = sync_and_eval(self.ctx, seq)
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        eog = self.model.vocab.eog
        for i in range(k):
            # --draft-p-min: stop where the draft is unsure. The test looks at the draft's
            # distribution only, never at the token drawn from it, so a kept token is still
            # an unbiased draw from q and rejection sampling stays exact.
            if params.greedy:
                x = int(np.argmax(logits))
                if self.p_min > 0 and softmax(logits)[x] < self.p_min:
                    break
            else:
                q = process(logits, params)
                if q.max() < self.p_min:
                    break
                x = sample(q, rng)
                probs.append(q)
            tokens.append(x)
            if x in eog or i == k - 1:
                break
            logits = self.ctx.eval([x], logits="last")[0]
        # --draft-min: too short a draft is not worth a batched pass. Under sampling the
        # length depends on the tokens drawn, so dropping short drafts would bias the kept
        # ones; there it is not applied.
        if params.greedy and len(tokens) < self.draft_min:
            return EMPTY_DRAFT
        return Draft(tokens=tokens, probs=np.stack(probs) if probs else None)

    def accepted(self, n: int) -> None:
        pass  # the cache is re-synchronised against the committed sequence on the next proposal

