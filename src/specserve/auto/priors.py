"""The engine's acceptance priors under `--spec auto`: what a new request's estimates start from.

Engine-level, shared by the requests (controller.py holds it), kept across processes: pooled
acceptance and delivery per drafter, match bucket and temperature regime (the prior of a new request),
how much requests have differed from it (Spread: how much that prior is worth), how acceptance moves
with the draft position (Shape), and the draft model's confidence maps (by its own top probability
and by the target's). A request's own estimates are estimates.py's.
"""
from __future__ import annotations

from .acceptance import ORDER_PRIOR, PRIOR_W, PRIORS, ConfidenceMap, Shape, Spread
from .names import FREE

# pseudo-trials behind a model drafter's acceptance before any data: two unlucky first drafts
# (0 of 2 at 70%: one engine in eleven) must not switch it off for good, since once off only
# probes priced by its catch-up can bring it back
PRIOR_TRIALS = 8.0
_THIN = 2.0  # trials a loaded pooled rate holds at least, the drafter's prior making up the rest
_G_ENGINE = 0.98  # per-step decay of the pooled counts


def _topped_up(counts: list[float], name: str, order: int, depth: float | None = None) -> list[float]:
    """Pooled [accepted, tried, delivered, asked] with the drafter's prior making up whatever trials
    they hold fewer than `depth` (default: the prior's own, PRIOR_TRIALS for a model drafter, 2 for
    a lookup)."""
    a, d = (ORDER_PRIOR[order], 1.0) if order else PRIORS.get(name, (0.7, 1.0))
    w = depth if depth is not None else PRIOR_TRIALS if name not in FREE else 2.0
    add, ask = max(w - counts[1], 0.0), max(w - counts[3], 0.0)
    return [counts[0] + add * a, counts[1] + add, counts[2] + ask * d, counts[3] + ask]


class Priors:
    """Pooled acceptance, its spread and shape, and the draft model's confidence maps."""

    def __init__(self):
        self.pooled: dict[tuple, list[float]] = {}  # (drafter, order, regime) -> decayed counts
        self.spread: dict[tuple, Spread] = {}  # (drafter, order, regime) -> how much requests differ there
        self.shape: dict[tuple, Shape] = {}  # (drafter, match bucket, regime) -> acceptance by draft position
        self.confidence: dict[tuple, ConfidenceMap] = {}  # (drafter, regime) -> acceptance by top probability
        # (drafter, regime) -> its acceptance by the target's top probability where a draft token was judged
        self.target_confidence: dict[tuple, ConfidenceMap] = {}

    def prior(self, name: str, order: int = 0, regime: float = 0.0) -> list[float]:
        """Pooled [accepted, tried, delivered, asked] of a drafter (at one match order) at one
        temperature regime: acceptance at temperature 0 says little about acceptance at 0.8."""
        key = (name, order, regime)
        p = self.pooled.get(key)
        if p is None:
            p = self.pooled[key] = _topped_up([0.0] * 4, name, order)
        return p

    def prior_weight(self, name: str, order: int, regime: float, mean: float) -> float:
        """Pseudo-trials the pooled rate `mean` of (drafter, order, regime) is worth to a request:
        as much as requests have been alike there (Spread), for a model drafter too: no floor
        (why: docs/auto-history.md)."""
        sp = self.spread.get((name, order, regime))
        return sp.weight(mean) if sp is not None else PRIOR_W

    def learn_spread(self, name: str, order: int, regime: float, rate: float, tried: float) -> None:
        """A finished request's own rate there, over `tried` (decayed) trials."""
        p = self.prior(name, order, regime)
        self.spread.setdefault((name, order, regime), Spread()).add(rate, p[0] / p[1], tried)

    def position_shape(self, name: str, order: int, regime: float) -> Shape:
        key = (name, order, regime)
        sh = self.shape.get(key)
        if sh is None:
            sh = self.shape[key] = Shape()
        return sh

    def confidence_map(self, name: str, regime: float) -> ConfidenceMap:
        """The drafter's acceptance by its own top probability at a drafted token."""
        return self.confidence.setdefault((name, regime), ConfidenceMap())

    def target_map(self, name: str, regime: float) -> ConfidenceMap:
        """The drafter's acceptance by the target's top probability where its token was judged."""
        return self.target_confidence.setdefault((name, regime), ConfidenceMap())

    def learn_pooled(self, name: str, order: int, regime: float, hit: int, tried: int,
                     delivered: int | None = None, asked: int | None = None) -> None:
        """A drafter's judged tokens there (hit of tried) and, where given, how many of the tokens
        asked it delivered, into the pooled counts (the prior of the next requests)."""
        p, g = self.prior(name, order, regime), _G_ENGINE
        p[0], p[1] = p[0] * g + hit, p[1] * g + tried
        if delivered is not None:
            p[2], p[3] = p[2] * g + delivered, p[3] * g + asked

    def state(self) -> dict:
        """Its sections of a saved profile (controller.Controller.state_dict)."""
        return {
            "pooled": [[name, order, regime, *counts] for (name, order, regime), counts in self.pooled.items()],
            "draft_confidence": [[name, regime, *m.state()] for (name, regime), m in self.confidence.items()],
            "target_confidence": [[name, regime, *m.state()] for (name, regime), m in self.target_confidence.items()],
            "spread": [[name, order, regime, *sp.state()] for (name, order, regime), sp in self.spread.items()],
            "shape": [[name, order, regime, *sh.state()] for (name, order, regime), sh in self.shape.items()],
        }

    @classmethod
    def from_state(cls, state: dict, weight: float) -> "Priors":
        """From a saved profile, its evidence scaled by `weight` (Controller.load_state_dict)."""
        pr = cls()
        for name, order, regime, *counts in state["pooled"]:
            if len(counts) != 4 or min(counts) < 0:
                raise ValueError("pooled acceptance counts of the wrong shape")
            # counts under _THIN trials are topped up with the drafter's prior: each load halves what
            # the last process did not refresh, and a regime unused for a few processes had kept its
            # last few trials' ratio (the draft model at 0.8: 0.21 kept of 1.28 tried), which a
            # request then trusted as much as requests were alike (Spread: 40 trials). Only to
            # _THIN: a bucket that gains one trial a request (the opening) keeps what it learnt.
            pr.pooled[(str(name), int(order), float(regime))] = _topped_up([float(c) * weight for c in counts],
                                                                           str(name), int(order), _THIN)
        # (absent in older profiles; their "confidence" maps are ignored: at a temperature above 0 with
        # no top-k, top-p or min-p they binned the probability of token id 0, not the draft's top one)
        pr.confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                         for name, regime, *counts in state.get("draft_confidence", [])}
        pr.target_confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                                for name, regime, *counts in state.get("target_confidence", [])}  # (likewise)
        pr.spread = {(str(name), int(order), float(regime)): Spread.from_state(moments)
                     for name, order, regime, *moments in state.get("spread", [])}  # (likewise)
        pr.shape = {(str(name), int(order), float(regime)): Shape.from_state(counts, 1.0)
                    for name, order, regime, *counts in state.get("shape", [])}  # (likewise)
        return pr
