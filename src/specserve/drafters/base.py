"""The drafter interface: propose up to k tokens, then learn how many were kept.

A drafter proposes a continuation of the committed sequence. `dists` carries the
draft's processed distribution at each drafted position when it has one (a draft
model), which rejection sampling needs; None means the draft is deterministic (prompt
lookup), which the verifier treats as q = one-hot. "No draft" is an empty Draft, never None.

Whatever a drafter keeps between steps (a KV cache, an index) is its own business: the
engine only asks what its cache lacks of the prompt and whether to take the prompt now
(`missing`, `prefill`), what it could draft this step before asking it to (`peek`), and
tells it how many tokens were kept (`accepted`). A drafter with a model of its own also
offers `propose_steps` and `prefill_steps`, the same work as a generator of forward passes
(steps.py), so that a server can batch them across slots. Under a grammar a drafter drafts
after the forced tokens (`continue_after_steps`) and says whether its drafts keep to the
grammar by themselves (`masked`). `BaseDrafter` has the defaults of a drafter without a cache:
a lookup's. `confidence`, when a drafter
gives one, is its own estimate that each token is right given the ones before it (the
suffix drafter: how often that token followed, among the earlier occurrences that agree
so far; a draft model: its top probability there); the verifier never reads it, a policy may.

A policy may hand a drafter a stopping rule for one proposal (`StopRule`): a drafter
that can tell its confidence before keeping a token (a draft model) asks it at each
token and stops where it says so. The rule sees the drafter's distribution only, never
the token drawn from it, so a kept token is still an unbiased draw and verification stays
exact. Drafters that cannot use a rule need not take the argument: `propose` passes it
only when there is one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

from ..sampling import Candidates, Sampler
from ..steps import Steps


@dataclass
class Draft:
    tokens: list[int]
    dists: list[Candidates] | None = None  # one one-row q per token, or None (deterministic)
    confidence: list[float] | None = None  # [len(tokens)] per-token estimate in (0, 1], or None
    # where the drafter found it, for the token trace (a lookup's: which earlier text); None: nothing to say
    note: dict | None = None

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[])

# stop(i, p) -> True: stop before keeping draft token i (0-based), drafted where the draft's
# top probability is p
StopRule = Callable[[int, float], bool]


class Offer(NamedTuple):
    """What a drafter could draft now, known before it is asked to: a match of `order`
    tokens (an n-gram's n; 0: nothing to draft) followed by `available` tokens."""

    order: int
    available: int


class Drafter(Protocol):
    """Made fresh for each request; state that outlives a request (a KV cache) is passed in."""

    name: str

    def missing(self, prompt: Sequence[int]) -> int:
        """Tokens of the prompt (all but its last token) that the drafter's cache lacks; 0 without a cache."""
        ...

    def prefill(self, prompt: Sequence[int]) -> None:
        """Take the prompt (all but its last token) now, in one batch, rather than at the first proposal."""
        ...

    def peek(self, seq: Sequence[int]) -> Offer | None:
        """What a proposal would draft after `seq`, if the drafter can tell cheaply (a lookup); else None."""
        ...

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens that follow `seq` (prompt + committed output).

        The token drafted at sequence position i should be drawn with the sampler's noise for
        position i (`sampler.pick(logits, i)`): that is what lets the verifier accept it. A
        drafter that takes a keyword `stop` (a StopRule) may be given one by `propose` below.
        """
        ...

    def accepted(self, n: int) -> None:
        """Told after verification how many of the last proposal's tokens were kept."""
        ...

    def propose_steps(self, seq: Sequence[int], k: int, sampler: Sampler) -> Steps:
        """`propose` as a generator that yields its forward passes (steps.Eval) and returns the Draft."""
        ...

    def prefill_steps(self, prompt: Sequence[int]) -> Steps:
        """`prefill` as a generator that yields its forward passes."""
        ...

    # whether its drafts keep to the request's grammar by themselves (a draft model drafting under the
    # mask); False: under a grammar they are cut at the first token it forbids (drafters.forced)
    masked: bool

    def continue_after_steps(self, seq: Sequence[int], head: Sequence[int], k: int, sampler: Sampler,
                             stop: StopRule | None = None) -> Steps:
        """Up to k tokens that follow seq + head, head being another drafter's tokens (not committed),
        as a generator of forward passes; with no head, its own proposal."""
        ...


class BaseDrafter:
    """Defaults for a drafter without a cache: nothing to prefill, nothing to peek at."""

    name = "base"

    def missing(self, prompt: Sequence[int]) -> int:
        return 0

    def prefill(self, prompt: Sequence[int]) -> None:
        pass

    def peek(self, seq: Sequence[int]) -> Offer | None:
        return None

    def accepted(self, n: int) -> None:
        pass

    def propose_steps(self, seq: Sequence[int], k: int, sampler: Sampler, **stop) -> Steps:
        return self.propose(seq, k, sampler, **stop)  # its passes run directly (none for a lookup)
        yield  # unreachable: makes this a generator

    def prefill_steps(self, prompt: Sequence[int]) -> Steps:
        return self.prefill(prompt)
        yield  # unreachable: makes this a generator

    masked = False

    def continue_after_steps(self, seq: Sequence[int], head: Sequence[int], k: int, sampler: Sampler,
                             stop: StopRule | None = None) -> Steps:
        """A lookup's: its index follows the committed sequence, so it drafts past head only where its
        own proposal starts with head (what follows there); a stopping rule is not its to use."""
        m = len(head)
        draft = self.propose(seq, m + k, sampler)
        return tail(draft, m) if draft.tokens[:m] == list(head) else EMPTY_DRAFT
        yield  # unreachable: makes this a generator


def tail(draft: Draft, m: int) -> Draft:
    """The draft after its first m tokens."""
    return Draft(draft.tokens[m:], draft.dists[m:] if draft.dists else None,
                 draft.confidence[m:] if draft.confidence else None)


def propose(drafter: Drafter, seq: Sequence[int], k: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
    """drafter.propose, with the stopping rule when there is one (a drafter that never gets
    one need not know the keyword)."""
    if k <= 0:
        return EMPTY_DRAFT
    if stop is None:
        return drafter.propose(seq, k, sampler)
    return drafter.propose(seq, k, sampler, stop=stop)


def propose_steps(drafter: Drafter, seq: Sequence[int], k: int, sampler: Sampler,
                  stop: StopRule | None = None) -> Steps:
    """drafter.propose_steps (the proposal as forward passes a server can batch), with the
    stopping rule when there is one."""
    if k <= 0:
        return EMPTY_DRAFT
    if stop is None:
        return (yield from drafter.propose_steps(seq, k, sampler))
    return (yield from drafter.propose_steps(seq, k, sampler, stop=stop))
