"""The hybrid drafter: a lookup's continuation first, the draft model from where it ends.

A lookup (suffix, then prompt lookup) proposes the m tokens that followed an earlier
occurrence of the text's end, for free; when the policy asks for k > m tokens, the draft
model continues after them (its first batch takes the m tokens). The policy plans it only
when a lookup matches (auto plans them as FREE: auto/names.py); with no match it drafts nothing.

Under sampling the lookup's tokens are deterministic (q = one-hot) and the model's carry
their distributions, so one draft mixes both and rejection sampling stays exact.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sampling import Candidates, Sampler
from .base import EMPTY_DRAFT, BaseDrafter, Draft, Drafter, StopRule

LOOKUPS = ("suffix", "ngram")  # the lookups it follows, by name, in the order it tries them


class HybridDrafter(BaseDrafter):
    """Its parts keep their own state: nothing to prefill (the draft model's own entry does that)."""

    name = "hybrid"

    def __init__(self, lookups: Sequence[Drafter], model):
        self.lookups, self.model = list(lookups), model  # model: a DraftModelDrafter

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        head = EMPTY_DRAFT
        for lookup in self.lookups:
            head = lookup.propose(seq, k, sampler)
            if head.tokens:
                break
        m = len(head)
        if not m:
            return EMPTY_DRAFT
        rest = self.model.continue_after(seq, head.tokens, k - m, sampler, stop) if m < k else EMPTY_DRAFT
        return chain(head, rest, sampler)


def chain(head: Draft, rest: Draft, sampler: Sampler) -> Draft:
    """One draft of a deterministic head (a lookup's or forced tokens) and what followed it (a
    draft model's, with its distributions under sampling, or another deterministic run)."""
    m = len(head)
    if not len(rest):
        return Draft(tokens=list(head.tokens), confidence=head.confidence)
    tokens = [*head.tokens, *rest.tokens]
    dists = None
    if not sampler.greedy and rest.dists:  # one one-row q per token: one-hot for the head's
        dists = [Candidates(np.array([[t]], np.int64), np.ones((1, 1), np.float32)) for t in head.tokens]
        dists += rest.dists
    confidence = None
    if rest.confidence:
        confidence = [*(head.confidence or [1.0] * m), *rest.confidence]
    return Draft(tokens=tokens, dists=dists, confidence=confidence)
