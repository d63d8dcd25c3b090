"""One request's acceptance estimates under `--spec auto`, and what it learns into them.

- acceptance per draft position, per drafter, and for a lookup per match bucket (a 4-token
  match predicts a copy far better than a 1-token one), decayed and shrunk toward the
  engine's pooled rates (controller.py), which are the prior of the next request, each
  position as the engine has seen acceptance move with the position (acceptance.Shape);
- delivery: how often a drafter that may stop early (a draft model) returns an i-th token;
- how sure the target has been of this request's last ~10 tokens: with the engine's target
  map, what the draft model is expected to keep here (`model_level`), known at sampled steps
  before the draft model has paid a catch-up to find out.

A lookup's acceptance is learnt at every step where it matched, also where it did not draft
(`learn_shadow`, from Outcome.shadow), so a request where lookups fail (a translation) learns it
without paying a pass per failed lookup. A match at the request's first step ends in the prompt's
template and is learnt apart (OPENING), and so is the draft model's first draft (the pair may open
an answer differently: docs/auto-history.md).
"""
from __future__ import annotations

import math

from ..drafters.suffix import SAME_REQUEST, SuffixDrafter
from .acceptance import OPENING, RATE_MAX, REPEAT, REPEAT_RATE_MAX, ConfidenceMap, Rates, Shape, match_bucket
from .names import FREE, MODEL
from .request_state import Setup
from .shared import Shared

_SEEN_MIN = 2.0  # (decayed) tokens of the target's record before it predicts the draft model's acceptance
OPTIMISM = 1.0  # standard errors by which a cold request's draft model is planned above its level
_G_SEEN = 0.9  # per-token decay of a request's record of the target's top probability: its last ~10 tokens


def bucket(name: str, order: int, at: int) -> int:
    """The acceptance bucket of a lookup's match offered after `at` generated tokens: REPEAT where the
    suffix drafter's match is the same request again (its earlier answer to this prompt), else
    OPENING at a request's first step, else by its length."""
    if name == SuffixDrafter.name and order >= at + SAME_REQUEST:
        return REPEAT
    return OPENING if at == 0 else match_bucket(order)


class Estimates:
    """One request's acceptance and delivery by drafter, position and match bucket."""

    def __init__(self, ctl: Shared, setup: Setup):
        self.ctl, self.caps, self.regime, self.kind = ctl, setup.caps, setup.regime, setup.kind
        self.acc = {n: Rates(self.caps[n]) for n in setup.names}
        # a model drafter's acceptance at the request's first step, learnt apart (OPENING)
        self.opening = {n: Rates(self.caps[n]) for n in setup.names if n not in FREE}
        self.by_match: dict[tuple[str, int], Rates] = {}  # a lookup's acceptance by match bucket
        self.judged: dict[tuple[str, int], list] = {}  # (drafter, bucket) -> [hit, tried] per Shape group
        self.dlv = {n: Rates(self.caps[n]) for n in setup.names}
        # decayed counts of the target's top probability at this request's recent tokens, by
        # ConfidenceMap bucket (sampled requests)
        self.seen_top = [0.0] * len(ConfidenceMap.MIDS)

    # --- read by the plans -----------------------------------------------------------------

    def rates(self, name: str, bucket: int, rates: Rates) -> list[float]:
        """A request's acceptance by position, leaning on the engine's pooled rate as much as
        requests were alike, each position as the engine's acceptance moves with it (Shape)."""
        q = self.ctl.priors.prior(name, bucket, self.kind)
        mean = q[0] / q[1]
        if name == MODEL and bucket == 0:
            mean = self.model_level(mean)
        shape = self.ctl.priors.position_shape(name, bucket, self.kind).factors(self.caps[name])
        return rates.rates(mean, self.ctl.priors.prior_weight(name, bucket, self.kind, mean), shape,
                           REPEAT_RATE_MAX if bucket == REPEAT else RATE_MAX)

    def optimistic(self, name: str, acc: list[float]) -> list[float]:
        """`acc` (a draft model's rates by position) raised by OPTIMISM standard errors of the request's
        level: what it may keep as far as the evidence goes."""
        q = self.ctl.priors.prior(name, 0, self.kind)
        mean = self.model_level(q[0] / q[1])
        rates = self.acc[name]
        w = self.ctl.priors.prior_weight(name, 0, self.kind, mean)
        level = rates.level(mean, w)
        if not 0.0 < level < 1.0:
            return acc
        up = min(level + OPTIMISM * math.sqrt(level * (1.0 - level) / (rates.t + w + 1.0)), RATE_MAX) / level
        return [min(a * up, RATE_MAX) for a in acc]

    def lookup(self, name: str, bucket: int) -> list[float]:
        """A lookup's acceptance by position after a match in `bucket`."""
        return self.rates(name, bucket, self.by_match.setdefault((name, bucket), Rates(self.caps[name])))

    def model_level(self, pooled: float) -> float:
        """The draft model's expected acceptance in this request: what the engine's target map says
        of tokens as sure as this request's recent ones, once both have seen enough (else `pooled`).

        A pooled rate is the same for a code answer, where the 0.5B keeps 0.9 of its tokens, and
        for a translation at 0.8, where it keeps about half; which kind a request is showed only
        once the draft model had paid its prompt's catch-up and drafted at a loss. How sure the
        target has been of the request's own tokens is known at every sampled step for free."""
        if sum(self.seen_top) < _SEEN_MIN:
            return pooled
        level = self.ctl.priors.target_map(MODEL, self.regime).expected(self.seen_top)
        return pooled if level is None else level

    # --- learnt from the steps -------------------------------------------------------------

    def see_target(self, top) -> None:
        """The target's top probability at the step's tokens (Outcome.target_top)."""
        seen = self.seen_top
        for p in top:
            for b in range(len(seen)):
                seen[b] *= _G_SEEN
            seen[ConfidenceMap.bucket(p)] += 1.0

    def learn(self, name: str, bucket: int, rates: Rates, tried: int, hit: int) -> None:
        """A judged draft: the request's rates, and its counts for the engine's Shape (at finish)."""
        rates.add(tried, hit)
        Shape.judge(self.judged.setdefault((name, bucket), [[0.0] * Shape.GROUPS, [0.0] * Shape.GROUPS]),
                    tried, hit)

    def learn_lookup(self, name: str, bucket: int, tried: int, hit: int) -> None:
        """A lookup's tokens after a match in `bucket`: this request's rates and the engine's prior."""
        if not tried:
            return
        self.learn(name, bucket, self.by_match.setdefault((name, bucket), Rates(self.caps[name])), tried, hit)
        self.ctl.learn_pooled(name, bucket, self.kind, hit, tried)

    def learn_shadow(self, shadow, skip: tuple, offers: dict, at: int) -> list[str]:
        """What the lookups that did not draft (none in `skip`) would have: their acceptance at every
        step, unasked; the lookups learnt of.

        A lookup is judged against the committed tokens at each step where it matched
        (engine: Outcome.shadow), so this request learns how its lookups fare without paying a
        pass for a failed one, and never needs to probe them."""
        learnt = []
        for name, (tried, hit) in shadow.items():
            order = offers.get(name, (0, 0))[0]
            # the engine judges a lookup's proposal against every committed token, which after a long
            # draft (8 kept + the bonus) runs past a lookup capped at --draft-max: it would draft its cap
            tried = min(tried, self.caps.get(name, 0))
            hit = min(hit, tried)
            if name in FREE and name in self.caps and name not in skip and order and tried:
                self.learn_lookup(name, bucket(name, order, at), tried, hit)
                self.acc[name].add(tried, hit)
                self.ctl.judged_unasked(name)
                learnt.append(name)
        return learnt

    def report(self) -> None:
        """The request ended: tell the engine how far its rates were from the pooled ones (Spread),
        and how its drafts held by position against its own rate (Shape)."""
        rates = [(name, 0, r) for name, r in self.acc.items()]
        rates += [(name, bucket, r) for (name, bucket), r in self.by_match.items()]
        for name, bucket, r in rates:
            if r.rate is not None:
                self.ctl.learn_spread(name, bucket, self.kind, r.rate, r.t)
        for (name, bucket), counts in self.judged.items():
            self.ctl.priors.position_shape(name, bucket, self.kind).add(counts)
