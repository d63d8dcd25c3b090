"""Which drafter and how many tokens to draft, each step.

A Policy is asked before every step and told the outcome after it. FixedPolicy is
what `--spec draft|ngram|none` means; the adaptive policy behind `--spec auto`
lives in the auto package.

Before choosing, a policy that wants it (`sees_offers`) is told what each drafter could draft
this step when the drafter can tell cheaply (`Drafter.peek`: prompt lookup's match), as
`see(drafter, offer)` for each such drafter (`tell_offers`, `ask_offers`), also before the
first step, when it decides whether a draft model takes the prompt.

Such a policy is also told, after the step, how each of those drafters would have fared had
it drafted (`Outcome.shadow`): what it would have proposed, judged against the tokens the
step committed as verification would have judged it (`judge`). A lookup costs nothing to
ask, so its acceptance is measured at every step, not only at the steps it drafts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class Choice:
    drafter: str | None  # a drafter's name, or None for plain decoding
    k: int  # draft length; 0 = plain decoding
    # the draft model's stopping rule for this step, stop(i, top probability) -> whether to
    # stop before keeping draft token i (drafters.base.StopRule); None: draft up to k
    stop: Callable[[int, float], bool] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Outcome:
    choice: Choice
    n_drafted: int  # may be below choice.k: drafters stop early
    n_accepted: int
    t_draft: float  # seconds spent drafting
    t_verify: float  # seconds of the target pass over 1 + n_drafted tokens
    confidence: Sequence[float] | None = None  # the draft's own per-token confidence (Draft.confidence)
    # drafter -> (positions judged, positions right): a drafter that did not draft this step
    # (a lookup that had a match), judged against the committed tokens (`judge`)
    shadow: Mapping[str, tuple[int, int]] | None = None
    # the target's top probability where each draft token was judged and at the step's own token
    # (Verdict.target_top: rows 0..n_accepted); empty when greedy
    target_top: Sequence[float] = ()
    # leading draft tokens the grammar forced (drafters.forced.ForcedThen), drafted for free ahead of
    # the chosen drafter's own; counted in n_drafted and n_accepted
    forced: int = 0


def judge(proposal: Sequence[int], committed: Sequence[int]) -> tuple[int, int]:
    """(judged, right): a draft against the tokens a step committed (the target's own tokens
    there), as verification judges it: up to its first wrong token, and no further than
    what was committed. Under greedy decoding and --verify gumbel a draft token is accepted
    exactly where it equals the committed one; under rejection sampling a deterministic
    draft token x is accepted with the target's p(x), the chance the committed token is x."""
    right = 0
    for x, y in zip(proposal, committed):
        if x != y:
            return right + 1, right
        right += 1
    return right, right


class Policy(Protocol):
    predicted_tokens_per_s: float
    # Whether to be told each step what the drafters could draft: then see(drafter, offer) is
    # called for every drafter that can tell, before choose.
    sees_offers: bool

    def see(self, drafter: str, offer: tuple[int, int]) -> None:
        """What the drafter would draft this step: (match length, 0 for none; tokens available)."""
        ...

    def choose(self) -> Choice: ...

    def observe(self, outcome: Outcome) -> None: ...

    def prefill(self, drafter: str, n_missing: int, max_tokens: int) -> bool:
        """Whether the drafter's cache should take the prompt (n_missing tokens) before the first step."""
        ...

    def prefilled(self, drafter: str, n_tokens: int, seconds: float) -> None:
        """Told what that prefill cost."""
        ...

    def finish(self) -> None:
        """The request ended (finished, stopped or cancelled)."""
        ...


OFF = Choice(None, 0)


def wants_offers(policy) -> bool:
    """Whether the policy wants to know, before each choice, what the drafters could draft."""
    return bool(getattr(policy, "sees_offers", False))


def tell_offers(policy, offers: Mapping[str, tuple[int, int]]) -> None:
    """Tell the policy each drafter's offer ((order, available): drafters.base.Offer) for this step."""
    if getattr(policy, "sees_offers", False):
        for name, offer in offers.items():
            policy.see(name, offer)


def ask_offers(policy, drafters: Mapping, seq: Sequence[int]) -> dict[str, tuple[int, int]]:
    """Tell a policy that wants them what each drafter that can tell (`peek`: the lookups) would draft
    after `seq`; the offers told ({} for a policy that does not want them)."""
    if not wants_offers(policy):
        return {}
    offers = {name: o for name, d in drafters.items() if (o := d.peek(seq)) is not None}
    tell_offers(policy, offers)
    return offers


class FixedPolicy:
    """Always the same drafter and draft length."""

    predicted_tokens_per_s = 0.0
    sees_offers = False

    def __init__(self, drafter: str | None, k: int):
        self._choice = Choice(drafter, k) if drafter and k > 0 else OFF

    def choose(self) -> Choice:
        return self._choice

    def observe(self, outcome: Outcome) -> None:
        pass

    def prefill(self, drafter: str, n_missing: int, max_tokens: int) -> bool:
        return drafter == self._choice.drafter  # it would catch up at its first step anyway

    def prefilled(self, drafter: str, n_tokens: int, seconds: float) -> None:
        pass

    def finish(self) -> None:
        pass
