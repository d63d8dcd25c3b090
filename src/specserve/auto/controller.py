"""The engine-level state of `--spec auto`, shared by the requests of one engine.

Holds what every request plans from, in parts by what it is: the measured costs (cost.Costs),
the acceptance priors (priors.Priors: pooled acceptance per drafter, match bucket and temperature
regime, how much requests have differed from it, the draft model's confidence maps), the probe
pacing (pacing.Pacing), what requests have been (history.History: how many, how long, how much the
lookups covered) and what is kept across processes (Profile, below). Each request plans
with its own `AutoPolicy` (request.py), which reads this state through the `Shared` protocol
(shared.py) and changes it only through the verbs below (learn_*, passed, drafted_with, ...).

Threads: the slots of one engine run their requests on several threads, all on one
Controller. Its state is guarded by one lock, `Controller.lock`, held around every read
and every write of it: AutoPolicy takes it once on entering choose, observe, prefill and
prefilled, and reads the parts (priors.prior, costs.draft_coef, ...) and calls the verbs below
only while it holds it. Nothing else is shared: a policy's own state is its request's,
touched by the one thread that runs it, and what a step hands the draft model (a
planner.ConfidenceStop) is its own copy.

What it learns can be kept across processes (`learned.ProfileStore`): `state_dict()`
and `load_state_dict()` carry the measured costs, the acceptance priors and the requests'
history, not the probe pacing of the moment.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Sequence

from ..config import SpecParams
from .acceptance import ConfidenceMap, Shape
from .cost import Costs
from .history import History
from .pacing import Pacing
from .draft_prefill import Gain
from .priors import Priors
from .request import AutoPolicy

log = logging.getLogger("specserve")

# sections of a saved state whose evidence a load scales down, by the leading fields that key an entry
_SCALED = {"pooled": 3, "draft_confidence": 2, "target_confidence": 2, "lookup_share": 1, "speedup": 1}


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


@dataclass
class Profile:
    """What is kept across processes: the store, and what the engine started from."""

    store: object = None  # a learned.ProfileStore, or None: nothing kept across processes
    n_requests: int = 0  # requests begun (the store saves every few)
    loaded: bool = False  # whether it started from a saved profile (whose costs calibrate() checks)
    as_loaded: tuple[dict, dict] | None = None  # (the state as loaded, as saved): _untouched_as_saved


class Controller:
    """Engine-level state shared by the requests of one engine: costs, priors, probe pacing, history."""

    def __init__(self, store=None, prefill_gain: Gain | None = None):
        """store: a learned.ProfileStore, or None: nothing kept across processes. prefill_gain: how its
        requests price a prompt catch-up up front (prefill.spread_gain unless given)."""
        self.lock = threading.Lock()  # held around every read and write of what follows
        self.prefill_gain = prefill_gain
        self.costs = Costs()
        self.priors = Priors()
        self.pacing = Pacing()
        self.history = History()
        self.profile = Profile(store)

    def policy(self, spec: SpecParams, drafter_names: list[str], temperature: float = 0.0,
               prompt: Sequence[int] | None = None):
        """A new request's AutoPolicy; prompt: its tokens, which make its kind (kinds.py)."""
        with self.lock:
            self.history.began()
            profile = self.profile
            profile.n_requests += 1
            if profile.store is not None and profile.store.due(profile.n_requests):
                profile.store.save(self._state(), profile.n_requests)
            return AutoPolicy(self, spec, drafter_names, temperature, self.prefill_gain, prompt)

    # --- kept across processes ---------------------------------------------------------------

    def load(self) -> bool:
        """Take up the store's saved state, if it has one for these models; whether it did."""
        store = self.profile.store
        state = store.load() if store is not None else None
        if state is None:
            return False
        try:
            self.load_state_dict(state)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            log.warning("ignoring a malformed auto profile (%s)", e)
            self.__init__(store, self.prefill_gain)
            return False
        self.profile.loaded = True
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
        its saved cost during such a spell, and rescaled it). The other way round is no spell of
        now's: a target pass `tolerance` times cheaper than saved says the profile was learnt while
        the machine was busy, and every saved cost, the target's passes too, comes to what was
        measured now (a newcomer's first run beside a build saved passes and the draft at 2-4x; the
        next process's 1-token passes soon replaced the target's, never the draft's, which it then
        priced at twice the target and did not draft).
        """
        with self.lock:
            costs = self.costs
            fit, V = costs.draft.get(name), costs.verify.table(2)
            if fit is None or V is None or seconds_per_token <= 0:
                return 1.0
            b = costs.draft_coef(name, V)[1]
            machine = target_seconds / V[1] if target_seconds and V[1] > 0 else 1.0
            if machine < 1 / tolerance:  # the profile's costs are a busy machine's
                costs.verify.scale(machine)
                factor = seconds_per_token / b if b > 0 else 1.0
            else:
                factor = seconds_per_token / b / machine if b > 0 else 1.0
                if 1 / tolerance <= factor <= tolerance:
                    return 1.0
            costs.scale(name, factor)
        log.info("auto: the saved cost of drafter %r was %.1f ms a token, measured now %.1f (the target's pass "
                 "%.2fx its saved cost): rescaled by %.2f", name, 1e3 * b, 1e3 * seconds_per_token, machine, factor)
        return factor

    def save(self) -> None:
        if self.profile.store is not None:
            with self.lock:
                self.profile.store.save(self._state(), self.profile.n_requests)

    def state_dict(self) -> dict:
        with self.lock:
            return self._state()

    def _state(self) -> dict:
        state = self._current_state()
        if self.profile.as_loaded is not None:
            _untouched_as_saved(state, *self.profile.as_loaded)
        return state

    def _current_state(self) -> dict:
        return {**self.costs.state(), **self.priors.state(), **self.history.state()}

    def load_state_dict(self, state: dict, weight: float = 0.5) -> None:
        """Restore a saved state, its evidence scaled by `weight` so that this process's own
        measurements soon outweigh it (the machine may be busier or quieter than it was)."""
        costs = Costs.from_state(state, weight, self.costs.cost_ratio)
        priors = Priors.from_state(state, weight)
        history = History.from_state(state, weight)
        with self.lock:
            self.costs, self.priors, self.history = costs, priors, history
            self.pacing.profiled = frozenset(costs.draft) | {name for name, _, _ in priors.pooled}
            self.profile.as_loaded = (self._current_state(), state)

    # --- its verbs: the writes are the Shared protocol's (policies hold the lock); a policy reads the
    # parts themselves, the others (tests, tools) may read through these -----------------------

    def prior(self, name: str, order: int = 0, regime: float = 0.0) -> list[float]:
        return self.priors.prior(name, order, regime)

    def prior_weight(self, name: str, order: int, regime: float, mean: float) -> float:
        return self.priors.prior_weight(name, order, regime, mean)

    def learn_spread(self, name: str, order: int, regime: float, rate: float, tried: float) -> None:
        self.priors.learn_spread(name, order, regime, rate, tried)

    def position_shape(self, name: str, order: int, regime: float) -> Shape:
        return self.priors.position_shape(name, order, regime)

    def confidence_map(self, name: str, regime: float) -> ConfidenceMap:
        return self.priors.confidence_map(name, regime)

    def target_map(self, name: str, regime: float) -> ConfidenceMap:
        return self.priors.target_map(name, regime)

    def learn_pooled(self, name: str, order: int, regime: float, hit: int, tried: int,
                     delivered: int | None = None, asked: int | None = None) -> None:
        self.priors.learn_pooled(name, order, regime, hit, tried, delivered, asked)

    def draft_coef(self, name: str, V: list[float]) -> list[float]:
        return self.costs.draft_coef(name, V)

    def learn_prompt_cost(self, name: str, per_token: float) -> None:
        self.costs.learn_prompt_cost(name, per_token)

    def learn_draft_cost(self, name: str, n: int, lag: int, seconds: float) -> None:
        self.costs.learn_draft_cost(name, n, lag, seconds)

    def passed(self, n_drafted: int, t_draft: float, t_verify: float, n_tokens: int) -> None:
        """A step drafted n_drafted tokens in t_draft seconds, verified them in t_verify, made n_tokens."""
        self.pacing.clock += t_draft + t_verify
        self.history.tokens += n_tokens
        self.costs.verify.add(1 + n_drafted, t_verify)

    def learn_length(self, n_tokens: int) -> None:
        self.history.learn_length(n_tokens)

    def share_of_lookups(self, regime: float) -> float:
        return self.history.share_of_lookups(regime)

    def learn_lookup_share(self, regime: float, covered: float, tokens: int) -> None:
        self.history.learn_lookup_share(regime, covered, tokens)

    def learn_speedup(self, kind: float | str, tokens: int, passes: float) -> None:
        self.history.learn_speedup(kind, tokens, passes)

    def probe_interval(self, name: str) -> int:
        return self.pacing.probe_interval(name)

    def learn_probe(self, name: str, paid: bool) -> None:
        self.pacing.learn_probe(name, paid)

    def drafted_with(self, name: str) -> None:
        self.pacing.drafted_with(name)

    def judged_unasked(self, name: str) -> None:
        self.pacing.judged_unasked(name)
