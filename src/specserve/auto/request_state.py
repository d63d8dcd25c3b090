"""Where one request's `--spec auto` policy stands: its drafters (Setup) and its progress (Progress).

Both are read by the policy's parts (estimates.py, lags.py, probing.py, prefill.py); the policy
(request.py) is the one that advances Progress.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..config import SpecParams
from .kinds import kind_of
from .names import FORCED, FREE, HYBRID, HYBRID_LOOKUPS, MODEL

# plain steps in a row after which a second of the request is worth what it has made since (planner.pick), not
# its rate so far, until a lookup copies again: a copy that broke may resume within a step or two, and a plain
# step waits for it; one that does not resume (a coding answer that copied 18 tokens of its question, then wrote
# new code) priced the draft model's catch-up on the copy at the copy's rate for 90 plain steps, the catch-up
# growing each
PLAIN_RUN = 3


@dataclass(frozen=True)
class Setup:
    """The drafters one request plans over, their caps and the temperature regime it learns at."""

    names: list[str]  # the drafters planned and probed on their own (not the hybrid)
    hybrid: bool  # whether the hybrid (a lookup's match, then the draft model) is planned too
    caps: dict[str, int]  # how far each may draft
    cap: int  # the most any draft holds, a hybrid's too
    kmin: dict[str, int]  # the fewest tokens each is asked for
    regime: float  # pooled priors per 0.25 of temperature
    kind: float | str  # the kind of work it is (kinds.py), which keys the acceptance it learns and plans from

    @classmethod
    def of(cls, spec: SpecParams, names: list[str], temperature: float,
           prompt: Sequence[int] | None = None) -> "Setup":
        """prompt: the request's tokens, which with its temperature and grammar make its kind (None: the
        regime alone)."""
        own = [n for n in names if n != HYBRID]
        # a model drafter stops at --draft-max; a lookup drafter at its own, longer cap (which a
        # --draft-max the user set lowers: SpecParams.suffix_max)
        lookup_cap = spec.suffix_max or spec.draft_max
        caps = {n: lookup_cap if n in FREE else spec.draft_max for n in own}
        regime = min(round(temperature * 4) / 4, 2.0)
        return cls(names=own, hybrid=HYBRID in names and MODEL in names and any(n in names for n in HYBRID_LOOKUPS),
                   caps=caps, cap=max(caps.values(), default=spec.draft_max),
                   regime=regime, kind=kind_of(regime, prompt, FORCED in names),
                   # the draft model returns nothing below --draft-min under greedy: never ask for fewer
                   kmin={n: max(1, spec.draft_min) if n == MODEL else 1 for n in own})

    @property
    def has_lookups(self) -> bool:
        return any(n in FREE for n in self.names)


@dataclass
class Progress:
    """One request so far, and what its lookups offer now."""

    step: int = 0
    generated: int = 0  # tokens made
    clock: float = 0.0  # seconds of its own steps (drafting and verifying); the probe budget accrues with it
    covered: float = 0.0  # of the tokens made, those a lookup drafted and kept or would have
    max_tokens: int = 1 << 30  # the request's own cap on what it makes
    offers: dict[str, tuple[int, int]] = field(default_factory=dict)  # lookup -> (match length, tokens available)
    plain_run: int = 0  # its last steps that drafted nothing, in a row
    copied: bool = False  # a lookup has drafted tokens that were kept
    # (tokens, seconds) made since a run of plain steps showed a copy had ended, until a lookup copies again;
    # None outside such a spell (request.AutoPolicy.best)
    since_copy: tuple[float, float] | None = None

    @property
    def copying(self) -> bool:
        """A lookup has copied and no run of plain steps has shown the copy ended: a plain step now may
        let it resume."""
        return self.copied and self.since_copy is None

    def advance(self, tokens: int, seconds: float, drafted: bool, copied: bool) -> None:
        """A step made `tokens` in `seconds`; it drafted anything, a lookup's tokens were kept."""
        self.generated += tokens
        self.clock += seconds
        self.plain_run = 0 if drafted else self.plain_run + 1
        if copied:  # a lookup copies (again): the request's rate so far is what its seconds are worth
            self.copied, self.since_copy = True, None
        elif self.since_copy is not None:
            self.since_copy = (self.since_copy[0] + tokens, self.since_copy[1] + seconds)
        elif self.copied and self.plain_run >= PLAIN_RUN:  # the spell starts with those plain steps
            self.since_copy = (float(self.plain_run), self.plain_run * seconds)
