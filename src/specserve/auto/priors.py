"""The engine's acceptance priors under `--spec auto`: what a new request's estimates start from.

Engine-level, shared by the requests (controller.py holds it), kept across processes: pooled
acceptance and delivery per drafter, match bucket and kind of work (kinds.py: the temperature regime,
the prompt's length, whether it repeats itself, a grammar; the prior of a new request), how much
requests have differed from it (Spread: how much that prior is worth), how acceptance moves with the
draft position (Shape), and the draft model's confidence maps per temperature regime (by its own top
probability and by the target's). A request's own estimates are estimates.py's.

Kinds pool only as a prior, and only as far as they have predicted each other. A kind's pooled rate
starts, the first time a request of it plans, from the drafter's built-in prior, blended with the
other kinds' pooled rate at its regime by the weight `cross_weight` gives that rate: how close the
requests of one kind have come to the rate the other kinds pooled (a Spread per drafter, bucket and
regime, learnt at each request's end), none until 3 requests have said. A profile learnt on other
work (the README's main job, greedy, a short prompt: the 0.5B keeps 0.95) thus leaves a code edit's
acceptance at the priors' until requests have shown that what the main job kept is what edits keep.
"""
from __future__ import annotations

from .acceptance import ORDER_PRIOR, PRIOR_W, PRIORS, SPREAD_MIN_N, ConfidenceMap, Shape, Spread
from .kinds import kind_key, regime_of
from .names import FREE

# pseudo-trials behind a model drafter's acceptance before any data: two unlucky first drafts
# (0 of 2 at 70%: one engine in eleven) must not switch it off for good, since once off only
# probes priced by its catch-up can bring it back
PRIOR_TRIALS = 8.0
_THIN = 2.0  # trials a loaded pooled rate holds at least, the drafter's prior making up the rest
_G_ENGINE = 0.98  # per-step decay of the pooled counts


_CROSS_MIN = 4.0  # trials the other kinds at a regime hold before their pooled rate is compared with a request's


def _topped_up(counts: list[float], name: str, order: int, depth: float | None = None,
               rate: float | None = None) -> list[float]:
    """Pooled [accepted, tried, delivered, asked] with the drafter's prior making up whatever trials
    they hold fewer than `depth` (default: the prior's own, PRIOR_TRIALS for a model drafter, 2 for
    a lookup), at `rate` (default: the built-in one)."""
    a, d = (ORDER_PRIOR[order], 1.0) if order else PRIORS.get(name, (0.7, 1.0))
    a = a if rate is None else rate
    w = depth if depth is not None else PRIOR_TRIALS if name not in FREE else 2.0
    add, ask = max(w - counts[1], 0.0), max(w - counts[3], 0.0)
    return [counts[0] + add * a, counts[1] + add, counts[2] + ask * d, counts[3] + ask]


class Priors:
    """Pooled acceptance, its spread and shape, and the draft model's confidence maps."""

    def __init__(self):
        self.pooled: dict[tuple, list[float]] = {}  # (drafter, order, kind) -> decayed counts
        self.spread: dict[tuple, Spread] = {}  # (drafter, order, kind) -> how much requests differ there
        # (drafter, order, regime) -> how far a request's rate stood from the other kinds' pooled one there
        self.cross: dict[tuple, Spread] = {}
        self._index: tuple = (None, {})  # ((id, len) of pooled, (drafter, order, regime) -> kinds): _kinds
        self.shape: dict[tuple, Shape] = {}  # (drafter, match bucket, kind) -> acceptance by draft position
        self.confidence: dict[tuple, ConfidenceMap] = {}  # (drafter, regime) -> acceptance by top probability
        # (drafter, regime) -> its acceptance by the target's top probability where a draft token was judged
        self.target_confidence: dict[tuple, ConfidenceMap] = {}

    def prior(self, name: str, order: int = 0, kind: float | str = 0.0) -> list[float]:
        """Pooled [accepted, tried, delivered, asked] of a drafter (at one match order) for one kind
        of work (kinds.py; a float: a temperature regime alone): acceptance at temperature 0 says
        little about acceptance at 0.8, and the README's main job little about a code edit."""
        key = (name, order, kind)
        p = self.pooled.get(key)
        if p is None:
            p = self.pooled[key] = _topped_up([0.0] * 4, name, order, rate=self._start(name, order, kind))
        return p

    def _start(self, name: str, order: int, kind: float | str) -> float | None:
        """The rate a kind's pooled counts start from: the built-in prior, blended with the other kinds'
        pooled rate at its regime as far as that rate has predicted requests (None: the built-in alone)."""
        if not isinstance(kind, str):
            return None
        others = self.others(name, order, kind)
        w = self.cross_weight(name, order, regime_of(kind), others[0] if others else 0.5)
        if others is None or w <= 0:
            return None
        a = ORDER_PRIOR[order] if order else PRIORS.get(name, (0.7, 1.0))[0]
        return (PRIOR_W * a + w * others[0]) / (PRIOR_W + w)

    def others(self, name: str, order: int, kind: str) -> tuple[float, float] | None:
        """(pooled rate, trials) of the other kinds at kind's regime, once they hold _CROSS_MIN trials."""
        hit = tried = 0.0
        for k in self._kinds(name, order, regime_of(kind)):
            if k != kind:
                p = self.pooled[(name, order, k)]
                hit, tried = hit + p[0], tried + p[1]
        return (hit / tried, tried) if tried >= _CROSS_MIN else None

    def _kinds(self, name: str, order: int, regime: float) -> list:
        """The kinds with pooled counts of (drafter, order) at a regime: an index of `pooled`, remade when
        entries were added (a server's kinds are many, and a request's end asks once per bucket)."""
        if self._index[0] != (id(self.pooled), len(self.pooled)):
            index: dict[tuple, list] = {}
            for n, o, k in self.pooled:
                index.setdefault((n, o, regime_of(k)), []).append(k)
            self._index = ((id(self.pooled), len(self.pooled)), index)
        return self._index[1].get((name, order, regime), [])

    def cross_weight(self, name: str, order: int, regime: float, mean: float) -> float:
        """Pseudo-trials the other kinds' pooled rate is worth to a kind not yet seen: as much as it has
        predicted requests of a kind (Spread), nothing before 3 requests have said."""
        sp = self.cross.get((name, order, regime))
        return sp.weight(mean) if sp is not None and sp.n >= SPREAD_MIN_N else 0.0

    def prior_weight(self, name: str, order: int, kind: float | str, mean: float) -> float:
        """Pseudo-trials the pooled rate `mean` of (drafter, order, kind) is worth to a request:
        as much as requests have been alike there (Spread), for a model drafter too: no floor
        (why: docs/auto-history.md)."""
        sp = self.spread.get((name, order, kind))
        return sp.weight(mean) if sp is not None else PRIOR_W

    def learn_spread(self, name: str, order: int, kind: float | str, rate: float, tried: float) -> None:
        """A finished request's own rate there, over `tried` (decayed) trials: against its kind's pooled
        rate (Spread) and the other kinds' (the cross-kind Spread)."""
        p = self.prior(name, order, kind)
        self.spread.setdefault((name, order, kind), Spread()).add(rate, p[0] / p[1], tried)
        if isinstance(kind, str):
            others = self.others(name, order, kind)
            if others is not None:
                self.cross.setdefault((name, order, regime_of(kind)), Spread()).add(rate, others[0], tried)

    def position_shape(self, name: str, order: int, kind: float | str) -> Shape:
        key = (name, order, kind)
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

    def learn_pooled(self, name: str, order: int, kind: float | str, hit: int, tried: int,
                     delivered: int | None = None, asked: int | None = None) -> None:
        """A drafter's judged tokens there (hit of tried) and, where given, how many of the tokens
        asked it delivered, into the pooled counts (the prior of the next requests)."""
        p, g = self.prior(name, order, kind), _G_ENGINE
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
            "cross_spread": [[name, order, regime, *sp.state()] for (name, order, regime), sp in self.cross.items()],
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
            pr.pooled[(str(name), int(order), kind_key(regime))] = _topped_up([float(c) * weight for c in counts],
                                                                           str(name), int(order), _THIN)
        # (absent in older profiles; their "confidence" maps are ignored: at a temperature above 0 with
        # no top-k, top-p or min-p they binned the probability of token id 0, not the draft's top one)
        pr.confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                         for name, regime, *counts in state.get("draft_confidence", [])}
        pr.target_confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                                for name, regime, *counts in state.get("target_confidence", [])}  # (likewise)
        pr.spread = {(str(name), int(order), kind_key(regime)): Spread.from_state(moments)
                     for name, order, regime, *moments in state.get("spread", [])}  # (likewise)
        pr.cross = {(str(name), int(order), float(regime)): Spread.from_state(moments)
                    for name, order, regime, *moments in state.get("cross_spread", [])}  # (likewise)
        pr.shape = {(str(name), int(order), kind_key(regime)): Shape.from_state(counts, 1.0)
                    for name, order, regime, *counts in state.get("shape", [])}  # (likewise)
        return pr
