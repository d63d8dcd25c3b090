"""The engine-level state of `--spec auto`, shared by the requests of one engine.

Holds what every request plans from: the measured costs (cost.py), the pooled acceptance
per drafter, match bucket and temperature regime (the prior of a new request) and how much
requests have differed from it (how much that prior is worth), the draft
model's confidence maps (by its own top probability and by the target's), the probe pacing,
and how long requests run. Each request plans
with its own `AutoPolicy` (request.py), which reads this state through the `Shared` protocol
(shared.py) and changes it only through the verbs below (learn_*, passed, drafted_with, ...).

Threads: the slots of one engine run their requests on several threads, all on one
Controller. Its state is guarded by one lock, `Controller.lock`, held around every read
and every write of it: AutoPolicy takes it once on entering choose, observe, prefill and
prefilled, and calls the helpers below (prior, confidence_map, draft_coef, learn_prompt_cost)
only while it holds it. Nothing else is shared: a policy's own state is its request's,
touched by the one thread that runs it, and what a step hands the draft model (a
planner.ConfidenceStop) is its own copy.

What it learns can be kept across processes (`learned.ProfileStore`): `state_dict()`
and `load_state_dict()` carry the measured costs, the pooled acceptance and the
confidence maps, not the probe pacing of the moment.
"""
from __future__ import annotations

import logging
import threading

from ..config import SpecParams
from .acceptance import PRIOR_W, ORDER_PRIOR, PRIORS, ConfidenceMap, Shape, Spread
from .cost import DraftCost, VerifyCost
from .names import FREE
from .prefill import Gain
from .probing import PROBE_MAX, PROBE_MIN
from .request import AutoPolicy

log = logging.getLogger("specserve")

# pseudo-trials behind a model drafter's acceptance before any data: two unlucky first drafts
# (0 of 2 at 70%: one engine in eleven) must not switch it off for good, since once off only
# probes priced by its catch-up can bring it back
PRIOR_TRIALS = 8.0
_THIN = 2.0  # trials a loaded pooled rate holds at least, the drafter's prior making up the rest
_LENGTHS = 32  # finished requests whose lengths are kept (prefill.Prefill.prefill_horizon)
_G_SHARE = 0.9  # per-request decay of the lookups' share: about the last 10 requests
_G_ENGINE = 0.98  # per-step decay of the pooled counts
# sections of a saved state whose evidence a load scales down, by the leading fields that key an entry
_SCALED = {"pooled": 3, "draft_confidence": 2, "target_confidence": 2, "lookup_share": 1}


def _topped_up(counts: list[float], name: str, order: int, depth: float | None = None) -> list[float]:
    """Pooled [accepted, tried, delivered, asked] with the drafter's prior making up whatever trials
    they hold fewer than `depth` (default: the prior's own, PRIOR_TRIALS for a model drafter, 2 for
    a lookup)."""
    a, d = (ORDER_PRIOR[order], 1.0) if order else PRIORS.get(name, (0.7, 1.0))
    w = depth if depth is not None else PRIOR_TRIALS if name not in FREE else 2.0
    add, ask = max(w - counts[1], 0.0), max(w - counts[3], 0.0)
    return [counts[0] + add * a, counts[1] + add, counts[2] + ask * d, counts[3] + ask]


def _untouched_as_saved(state: dict, loaded: dict, saved: dict) -> None:
    """Entries of `state` still as they were loaded, put back as they were saved.

    A load scales evidence down, so that this process's own soon outweighs it. An entry no
    request of the process touched would otherwise shrink at every load and save: a regime
    left unused for a few processes (`specserve generate` is one request a process) kept
    about one trial and its last few trials' ratio, and its confidence maps fell under
    MAP_MIN and were no longer read. Touched entries are saved as they are."""
    for section, n in _SCALED.items():
        was = {tuple(e[:n]): e for e in loaded.get(section, [])}
        old = {tuple(e[:n]): e for e in saved.get(section, [])}
        state[section] = [list(old[key]) if key in old and was.get(key) == e else e
                          for e in state[section] for key in [tuple(e[:n])]]
    was, old = loaded["draft_cost"], saved.get("draft_cost", {})
    state["draft_cost"] = {name: old[name] if name in old and was.get(name) == fit else fit
                           for name, fit in state["draft_cost"].items()}


class Controller:
    """Engine-level state shared by the requests of one engine: costs, priors, probe pacing."""

    def __init__(self, store=None, prefill_gain: Gain | None = None):
        """store: a learned.ProfileStore, or None: nothing kept across processes. prefill_gain: how its
        requests price a prompt catch-up up front (prefill.spread_gain unless given)."""
        self.lock = threading.Lock()  # held around every read and write of what follows
        self.store = store
        self.prefill_gain = prefill_gain
        self.n_requests = 0
        self.verify = VerifyCost()
        self.draft: dict[str, DraftCost] = {}
        self.prompt_cost: dict[str, float] = {}  # seconds per prompt token a model drafter catches up (EMA)
        self.pooled: dict[tuple, list[float]] = {}  # (drafter, order, regime) -> decayed counts
        self.spread: dict[tuple, Spread] = {}  # (drafter, order, regime) -> how much requests differ there
        self.shape: dict[tuple, Shape] = {}  # (drafter, match bucket, regime) -> acceptance by draft position
        self.confidence: dict[tuple, ConfidenceMap] = {}  # (drafter, regime) -> acceptance by top probability
        # (drafter, regime) -> its acceptance by the target's top probability where a draft token was judged
        self.target_confidence: dict[tuple, ConfidenceMap] = {}
        self.interval: dict[str, int] = {}  # probe interval, steps
        self.last_used: dict[str, float] = {}  # self.clock when the drafter last drafted, any request
        self.shadowed: set[str] = set()  # lookups the engine judges at every step (Outcome.shadow): never probed
        self.clock = 0.0  # seconds of drafting and verifying observed, all requests
        self.requests, self.tokens = 1.0, 256.0  # decayed counts; a prior of 256 tokens a request
        self.lengths: list[int] = []  # tokens the last _LENGTHS finished requests made, oldest first
        # regime -> decayed [tokens a lookup drafted and kept or would have (its shadow), tokens made]
        self.lookup_share: dict[float, list[float]] = {}
        self.cost_ratio: dict[str, float] = {}  # a drafter's token cost / the target's, before any data
        self.loaded = False  # whether it started from a saved profile (whose costs calibrate() checks)
        self.profiled: frozenset[str] = frozenset()  # drafters the loaded profile measured
        self._as_loaded: tuple[dict, dict] | None = None  # (the state as loaded, as saved): _untouched_as_saved

    def policy(self, spec: SpecParams, drafter_names: list[str], temperature: float = 0.0):
        """A new request's AutoPolicy."""
        with self.lock:
            self.requests, self.tokens = 0.9 * self.requests + 1, 0.9 * self.tokens
            self.n_requests += 1
            if self.store is not None and self.store.due(self.n_requests):
                self.store.save(self._state(), self.n_requests)
            return AutoPolicy(self, spec, drafter_names, temperature, self.prefill_gain)

    # --- kept across processes ---------------------------------------------------------------

    def load(self) -> bool:
        """Take up the store's saved state, if it has one for these models; whether it did."""
        state = self.store.load() if self.store is not None else None
        if state is None:
            return False
        try:
            self.load_state_dict(state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            log.warning("ignoring a malformed auto profile (%s)", e)
            self.__init__(self.store, self.prefill_gain)
            return False
        self.loaded = True
        return True

    def calibrate(self, name: str, seconds_per_token: float, target_seconds: float | None = None,
                  tolerance: float = 2.0) -> float:
        """Check a loaded drafting cost against one measured now; the factor applied (1: kept).

        seconds_per_token: what one drafted token costs the model now (a 1-token pass). A profile
        learnt while the machine was busy can claim a draft model costs 2-3x what it does; auto
        then never drafts with it and never measures it again. Where the saved per-token cost b
        is off by more than `tolerance` either way, the drafter's saved costs (its regression and
        its prompt catch-up) are rescaled by measured / b: they all scale with the machine's speed.

        target_seconds: a 1-token target pass timed beside it. A slow spell of the whole machine
        slows both alike and changes no choice between them, so the draft's cost is then judged
        relative to the target's: only a draft that got dearer or cheaper than the target than
        the profile says is rescaled (an auto-fresh start once measured the 0.5B draft at 2.3-2.9x
        its saved cost during such a spell, and rescaled it).
        """
        with self.lock:
            fit, V = self.draft.get(name), self.verify.table(2)
            if fit is None or V is None or seconds_per_token <= 0:
                return 1.0
            b = self.draft_coef(name, V)[1]
            machine = target_seconds / V[1] if target_seconds and V[1] > 0 else 1.0
            factor = seconds_per_token / b / machine if b > 0 else 1.0
            if 1 / tolerance <= factor <= tolerance:
                return 1.0
            fit.scale(factor)
            if name in self.prompt_cost:
                self.prompt_cost[name] *= factor
        log.info("auto: the saved cost of drafter %r was %.1f ms a token, measured now %.1f (the target's pass "
                 "%.2fx its saved cost): rescaled by %.2f", name, 1e3 * b, 1e3 * seconds_per_token, machine, factor)
        return factor

    def save(self) -> None:
        if self.store is not None:
            with self.lock:
                self.store.save(self._state(), self.n_requests)

    def state_dict(self) -> dict:
        with self.lock:
            return self._state()

    def _state(self) -> dict:
        state = self._current_state()
        if self._as_loaded is not None:
            _untouched_as_saved(state, *self._as_loaded)
        return state

    def _current_state(self) -> dict:
        return {
            "verify": self.verify.state(),
            "draft_cost": {name: fit.state() for name, fit in self.draft.items()},
            "prompt_cost": dict(self.prompt_cost),
            "pooled": [[name, order, regime, *counts] for (name, order, regime), counts in self.pooled.items()],
            "draft_confidence": [[name, regime, *m.state()] for (name, regime), m in self.confidence.items()],
            "target_confidence": [[name, regime, *m.state()] for (name, regime), m in self.target_confidence.items()],
            "spread": [[name, order, regime, *sp.state()] for (name, order, regime), sp in self.spread.items()],
            "shape": [[name, order, regime, *sh.state()] for (name, order, regime), sh in self.shape.items()],
            "requests": self.requests, "tokens": self.tokens, "lengths": list(self.lengths),
            "lookup_share": [[regime, *counts] for regime, counts in self.lookup_share.items()],
        }

    def load_state_dict(self, state: dict, weight: float = 0.5) -> None:
        """Restore a saved state, its evidence scaled by `weight` so that this process's own
        measurements soon outweigh it (the machine may be busier or quieter than it was)."""
        v = VerifyCost.from_state(state["verify"])
        draft = {str(name): DraftCost.from_state(fit, weight) for name, fit in state["draft_cost"].items()}
        pooled = {}
        for name, order, regime, *counts in state["pooled"]:
            if len(counts) != 4 or min(counts) < 0:
                raise ValueError("pooled acceptance counts of the wrong shape")
            # counts under _THIN trials are topped up with the drafter's prior: each load halves what
            # the last process did not refresh, and a regime unused for a few processes had kept its
            # last few trials' ratio (the draft model at 0.8: 0.21 kept of 1.28 tried), which a
            # request then trusted as much as requests were alike (Spread: 40 trials). Only to
            # _THIN: a bucket that gains one trial a request (the opening) keeps what it learnt.
            pooled[(str(name), int(order), float(regime))] = _topped_up([float(c) * weight for c in counts],
                                                                        str(name), int(order), _THIN)
        # (absent in older profiles; their "confidence" maps are ignored: at a temperature above 0 with
        # no top-k, top-p or min-p they binned the probability of token id 0, not the draft's top one)
        confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                      for name, regime, *counts in state.get("draft_confidence", [])}
        target_confidence = {(str(name), float(regime)): ConfidenceMap.from_state(counts, weight)
                             for name, regime, *counts in state.get("target_confidence", [])}  # (likewise)
        spread = {(str(name), int(order), float(regime)): Spread.from_state(moments)
                  for name, order, regime, *moments in state.get("spread", [])}  # (likewise)
        shape = {(str(name), int(order), float(regime)): Shape.from_state(counts, 1.0)
                 for name, order, regime, *counts in state.get("shape", [])}  # (likewise)
        share = {}
        for regime, *counts in state.get("lookup_share", []):  # (likewise)
            if len(counts) != 2 or min(counts) < 0 or counts[0] > counts[1]:
                raise ValueError("lookup share counts of the wrong shape")
            share[float(regime)] = [float(c) * weight for c in counts]
        with self.lock:
            self.verify, self.draft, self.pooled, self.confidence = v, draft, pooled, confidence
            self.lookup_share = share
            self.spread, self.shape, self.target_confidence = spread, shape, target_confidence
            self.profiled = frozenset(draft) | {name for name, _, _ in pooled}
            self.prompt_cost = {str(k): float(x) for k, x in state["prompt_cost"].items()}
            self.requests, self.tokens = float(state["requests"]), float(state["tokens"])
            self.lengths = [int(n) for n in state.get("lengths", [])][-_LENGTHS:]  # (absent in older profiles)
            self._as_loaded = (self._current_state(), state)

    # --- read and written by policies, which hold the lock -----------------------------------

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

    def draft_coef(self, name: str, V: list[float]) -> list[float]:
        """[a, b, c]: seconds to draft n tokens after missing lag = a + b n + c (lag - 1)."""
        # before any data: a draft model costs its share of the target's weights (memory-bound decode)
        e = 0.0 if name in FREE else self.cost_ratio.get(name, 0.125) * V[1]
        r = self.verify.batching  # assumed to help the drafter as much as it helps the target
        fit = self.draft.get(name)
        return fit.coef(e, r) if fit is not None else [e, e, r * e]

    def learn_length(self, n_tokens: int) -> None:
        """A finished request made n_tokens."""
        self.lengths = [*self.lengths[1 - _LENGTHS:], int(n_tokens)]

    def share_of_lookups(self, regime: float) -> float:
        """Of the tokens recent requests at this regime made, the share a lookup drafted and kept
        or would have kept (0 before any request ended)."""
        covered, tokens = self.lookup_share.get(regime, (0.0, 0.0))
        return covered / tokens if tokens > 0 else 0.0

    def learn_lookup_share(self, regime: float, covered: float, tokens: int) -> None:
        """A finished request made `tokens`, of which lookups covered `covered`."""
        if tokens > 0:
            c = self.lookup_share.get(regime, [0.0, 0.0])
            self.lookup_share[regime] = [c[0] * _G_SHARE + covered, c[1] * _G_SHARE + tokens]

    def learn_prompt_cost(self, name: str, per_token: float) -> None:
        old = self.prompt_cost.get(name, per_token)
        self.prompt_cost[name] = 0.7 * old + 0.3 * per_token

    def passed(self, n_drafted: int, t_draft: float, t_verify: float, n_tokens: int) -> None:
        """A step drafted n_drafted tokens in t_draft seconds, verified them in t_verify, made n_tokens."""
        self.clock += t_draft + t_verify
        self.tokens += n_tokens
        self.verify.add(1 + n_drafted, t_verify)

    def learn_pooled(self, name: str, order: int, regime: float, hit: int, tried: int,
                     delivered: int | None = None, asked: int | None = None) -> None:
        """A drafter's judged tokens there (hit of tried) and, where given, how many of the tokens
        asked it delivered, into the pooled counts (the prior of the next requests)."""
        p, g = self.prior(name, order, regime), _G_ENGINE
        p[0], p[1] = p[0] * g + hit, p[1] * g + tried
        if delivered is not None:
            p[2], p[3] = p[2] * g + delivered, p[3] * g + asked

    def learn_draft_cost(self, name: str, n: int, lag: int, seconds: float) -> None:
        """A drafter took `seconds` for n tokens, its cache `lag` tokens behind."""
        fit = self.draft.get(name) or self.draft.setdefault(name, DraftCost())
        fit.add(n, lag, seconds)

    def drafted_with(self, name: str) -> None:
        """The drafter drafted now (its probes are paced from here)."""
        self.last_used[name] = self.clock

    def judged_unasked(self, name: str) -> None:
        """A lookup was judged against a step's tokens without drafting (Outcome.shadow): never probe it."""
        self.shadowed.add(name)

    def probe_interval(self, name: str) -> int:
        """Steps between probes of an unused drafter."""
        return self.interval.get(name, PROBE_MIN)

    def learn_probe(self, name: str, paid: bool) -> None:
        """A probe that drafted: probe again at once if it paid (or would have), else wait twice as long."""
        iv = self.probe_interval(name)
        self.interval[name] = 1 if paid else min(max(2 * iv, PROBE_MIN), PROBE_MAX)
