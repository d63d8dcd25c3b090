"""Grammar-forced tokens, drafted for free.

Where the grammar leaves one continuation (a schema's keys, quotes and punctuation),
llguidance's fast-forward tokens say what it is, with no model. `ForcedDrafter` ("grammar")
proposes them alone. With a grammar set, every other drafter is wrapped in `ForcedThen`:
the forced run first, then its own tokens after it in the same draft (the draft model
continues after the run as it does after a lookup's match in the hybrid; a lookup, whose
index follows the committed sequence, drafts past the run where its own proposal starts
with it: Drafter.continue_after_steps). A lookup's tokens are cut at the first one
the grammar forbids; the draft model drafts under the mask itself (Drafter.masked).

Forced tokens are deterministic (q = one-hot), so rejection sampling stays exact; where the
mask allows only them they are accepted by construction. llguidance's fast-forward stops
short of a token that a longer one could still extend, so they are the target's own
tokenization of the forced text.
"""
from __future__ import annotations

from typing import Sequence

from .. import steps
from ..sampling import Sampler
from .base import EMPTY_DRAFT, BaseDrafter, Draft, Drafter, Offer, StopRule
from .hybrid import chain

FORCED = "grammar"  # the forced drafter's name


class ForcedDrafter(BaseDrafter):
    name = FORCED

    def __init__(self, constraint):
        self.constraint = constraint  # grammar.Constraint: the request's committed grammar state

    def peek(self, seq: Sequence[int]) -> Offer:
        n = len(self.constraint.forced(64))
        return Offer(n, n)

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        tokens = self.constraint.forced(k)
        return Draft(tokens=tokens, confidence=[1.0] * len(tokens)) if tokens else EMPTY_DRAFT


class ForcedThen(BaseDrafter):
    """A drafter under a grammar: the forced run, then the drafter's own tokens that the grammar allows."""

    def __init__(self, constraint, inner: Drafter):
        self.constraint, self.inner, self.name = constraint, inner, inner.name
        self._m = 0  # forced tokens at the head of the last proposal

    def missing(self, prompt: Sequence[int]) -> int:
        return self.inner.missing(prompt)

    def prefill(self, prompt: Sequence[int]) -> None:
        self.inner.prefill(prompt)

    def prefill_steps(self, prompt: Sequence[int]) -> steps.Steps:
        return (yield from self.inner.prefill_steps(prompt))

    def peek(self, seq: Sequence[int]) -> Offer | None:
        return self.inner.peek(seq)

    def accepted(self, n: int) -> None:
        self.inner.accepted(max(0, n - self._m))  # what it kept of its own tokens

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        return steps.direct(self.propose_steps(seq, k, sampler, stop))

    def propose_steps(self, seq: Sequence[int], k: int, sampler: Sampler,
                      stop: StopRule | None = None) -> steps.Steps:
        head = self.constraint.forced(k)
        m, inner = len(head), self.inner
        self._m = m
        if m >= k:
            rest = EMPTY_DRAFT
        else:  # what it drafts after the forced run
            rest = yield from inner.continue_after_steps(seq, head, k - m, sampler, stop)
            if not inner.masked:  # a lookup's tokens, which know no grammar
                rest = self._cut(rest, head)
        if not m:
            return rest
        return chain(Draft(tokens=head, confidence=[1.0] * m), rest, sampler)

    def _cut(self, draft: Draft, head: Sequence[int]) -> Draft:
        """The draft up to the first token the grammar forbids after the committed tokens and head."""
        n = self.constraint.valid_prefix(draft.tokens, after=head)
        if n == len(draft):
            return draft
        return Draft(draft.tokens[:n], draft.dists[:n] if draft.dists else None,
                     draft.confidence[:n] if draft.confidence else None) if n else EMPTY_DRAFT


def with_grammar(drafters: dict[str, Drafter], constraint) -> dict[str, Drafter]:
    """The request's drafters under its grammar, and the forced drafter."""
    out: dict[str, Drafter] = {name: ForcedThen(constraint, d) for name, d in drafters.items()}
    out[FORCED] = ForcedDrafter(constraint)
    return out
