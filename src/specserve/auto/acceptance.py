"""How often drafts are accepted: per draft position, per lookup match length, per draft confidence.

`Rates` holds P(draft token i accepted | 1..i-1 accepted) for i = 1..cap as decayed
counts, shrunk toward a pooled rate: a request keeps one per drafter (and per match
bucket for the lookups). `ConfidenceMap` is what a draft model's own top probability at
a drafted token says about that token's acceptance, bucketed and learnt online; the
confidence stop (planner.ConfidenceStop) reads it.
"""
from __future__ import annotations

import bisect

_G_POS = 0.97  # per-trial decay of a request's counts at one draft position
_G_POOL = 0.95  # per-step decay of a request's pooled counts
_G_CONF = 0.995  # per-token decay of a confidence bucket's counts: the pair changes slowly
_SHRINK = 6.0  # pseudo-trials pulling a position's rate toward the pooled rate
_PRIOR_W = 10.0  # pseudo-trials pulling a request's pooled rate toward the engine's
_CONF_PRIOR_W = 4.0  # pseudo-trials pulling a confidence bucket toward "calibrated"

PRIORS = {"ngram": (0.6, 0.6)}  # (acceptance, delivery) before any data; others (0.7, 1.0)
# a lookup's acceptance given the order n of the match it follows (its draft follows an
# earlier occurrence of the last n tokens): longer matches predict better
ORDER_PRIOR = {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.6, 8: 0.7, 16: 0.8, 32: 0.85}


def match_bucket(order: int) -> int:
    """Match lengths pooled for acceptance: 1, 2, 3, 4-7, 8-15, 16-31, 32+."""
    if order < 4:
        return order
    return 4 if order < 8 else 8 if order < 16 else 16 if order < 32 else 32


class Rates:
    """P(success at draft position i | success at 1..i-1), i = 1..cap, as decayed counts."""

    def __init__(self, cap: int):
        self.hit, self.tried = [0.0] * cap, [0.0] * cap  # [cap] decayed counts per position
        self.h = self.t = 0.0  # pooled over positions
        self._cache: list[float] | None = None

    def add(self, n_tried: int, n_hit: int) -> None:
        for i in range(n_tried):
            self.hit[i] = self.hit[i] * _G_POS + (i < n_hit)
            self.tried[i] = self.tried[i] * _G_POS + 1.0
        self.h, self.t, self._cache = self.h * _G_POOL + n_hit, self.t * _G_POOL + n_tried, None

    def rates(self, prior: float) -> list[float]:
        """[cap], each shrunk toward the pooled rate, itself shrunk toward `prior`."""
        if self._cache is None:
            pooled = (self.h + _PRIOR_W * prior) / (self.t + _PRIOR_W)
            self._cache = [(h + _SHRINK * pooled) / (t + _SHRINK) for h, t in zip(self.hit, self.tried)]
        return self._cache


class ConfidenceMap:
    """P(a drafted token is accepted | the draft's top probability there), by bucket of that probability.

    Only tokens the verifier judged count (those up to the first rejection). Before data a
    bucket is calibrated: a token drafted at top probability p is accepted with about p.
    """

    EDGES = (0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)  # bucket b holds p in [EDGES[b-1], EDGES[b])
    MIDS = (0.1, 0.3, 0.45, 0.55, 0.65, 0.75, 0.85, 0.925, 0.97, 0.995)

    def __init__(self):
        self.hit, self.tried = [0.0] * len(self.MIDS), [0.0] * len(self.MIDS)
        self._table: tuple[float, ...] | None = None

    @classmethod
    def bucket(cls, p: float) -> int:
        return bisect.bisect_right(cls.EDGES, p)

    def add(self, confidence, n_accepted: int) -> None:
        """One verified draft: its per-token top probabilities and how many tokens were kept."""
        for i in range(min(len(confidence), n_accepted + 1)):
            b = self.bucket(confidence[i])
            self.hit[b] = self.hit[b] * _G_CONF + (i < n_accepted)
            self.tried[b] = self.tried[b] * _G_CONF + 1.0
        self._table = None

    def table(self) -> tuple[float, ...]:
        """[buckets] acceptance per bucket; the same tuple until the counts change."""
        if self._table is None:
            self._table = tuple((h + _CONF_PRIOR_W * m) / (t + _CONF_PRIOR_W)
                                for h, t, m in zip(self.hit, self.tried, self.MIDS))
        return self._table

    def state(self) -> list[list[float]]:
        return [list(self.hit), list(self.tried)]

    @classmethod
    def from_state(cls, state, weight: float) -> "ConfidenceMap":
        m = cls()
        hit, tried = state
        if len(hit) != len(m.hit) or len(tried) != len(m.tried):
            raise ValueError("confidence map of the wrong shape")
        m.hit, m.tried = [float(x) * weight for x in hit], [float(x) * weight for x in tried]
        return m
