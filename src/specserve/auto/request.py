"""One request's `--spec auto` policy: the per-request bookkeeping around the planner.

Each step it turns what it knows into planner options (planner.py) and takes the plan with
the most expected tokens per second; what it learns from each step's outcome is learning.py's,
when an unused drafter is tried again probing.py's, and whether a draft model takes the prompt
up front (and what catching up costs) prefill.py's. How auto decides, with measurements:
docs/auto.md.

The engine tells it, each step, what each lookup drafter would match (`see`), so a lookup is
planned only when it has a match, up to what it has. With a draft model and a lookup, the
hybrid (drafters.hybrid) is planned too: the lookup's m tokens, then the draft model from
where they end; it is planned only when a lookup matches fewer tokens than its cap.
Switching on a lagging drafter charges its catch-up over the tokens the request is still
expected to make.

Threads: a policy is used by one thread; every method that touches the shared Controller
holds its lock for the whole call (see controller.py).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..config import SpecParams
from ..drafters.suffix import SAME_REQUEST, SuffixDrafter
from ..policy import OFF, Choice, Outcome
from . import planner
from .acceptance import OPENING, REPEAT, ConfidenceMap, Rates, match_bucket
from .learning import Learning
from .names import FORCED, FREE, HYBRID, HYBRID_LOOKUPS, MODEL
from .prefill import Prefill
from .probing import EXPLORE_PASSES, Probing

if TYPE_CHECKING:
    from .controller import Controller

_SEEN_MIN = 2.0  # (decayed) tokens of the target's record (learning.py) before it predicts the draft model's acceptance
LOOKUP_MAX = 64  # how far a lookup drafter may draft under auto where the user set no cap

trace = logging.getLogger("specserve.auto")  # one DEBUG line a step: SPECSERVE_LOG=debug


class AutoPolicy(Learning, Probing, Prefill):
    """One request's adaptive policy; see the module docstring."""

    sees_offers = True  # the engine tells it, each step, what each lookup drafter would match: see(name, offer)

    def __init__(self, ctl: Controller, spec: SpecParams, names: list[str], temperature: float = 0.0):
        """Made by Controller.policy, under its lock."""
        self.ctl = ctl
        self.hybrid = HYBRID in names and MODEL in names and any(n in names for n in HYBRID_LOOKUPS)
        self.names = [n for n in names if n != HYBRID]  # the drafters planned and probed on their own
        self.has_lookups = any(n in FREE for n in self.names)
        # a model drafter stops at --draft-max; a lookup drafter at its own, longer cap (which a
        # --draft-max the user set lowers: SpecParams.suffix_max)
        lookup_cap = getattr(spec, "suffix_max", LOOKUP_MAX) or spec.draft_max
        self.caps = {n: lookup_cap if n in FREE else spec.draft_max for n in self.names}
        self.cap = max(self.caps.values(), default=spec.draft_max)  # a hybrid drafts at most this too
        self.regime = min(round(temperature * 4) / 4, 2.0)  # pooled priors per 0.25 of temperature
        # the draft model returns nothing below --draft-min under greedy: never ask for fewer
        self.kmin = {n: max(1, spec.draft_min) if n == MODEL else 1 for n in self.names}
        self.acc = {n: Rates(self.caps[n]) for n in self.names}
        # a model drafter's acceptance at the request's first step, learnt apart (OPENING)
        self._opening = {n: Rates(self.caps[n]) for n in self.names if n not in FREE}
        self.acc_order: dict[tuple[str, int], Rates] = {}  # a lookup drafter's acceptance by match bucket
        self._judged: dict[tuple[str, int], list] = {}  # (drafter, bucket) -> [hit, tried] per Shape group
        self.offers: dict[str, tuple[int, int]] = {}  # lookup drafter -> (match length, tokens available)
        self._step_offers: dict[str, tuple[int, int]] = {}
        self._step_at = 0  # tokens generated when this step was chosen (0: the request's first step)
        self._step_head: tuple[str, int, int] | None = None  # a hybrid step's (lookup, match bucket, m)
        self.dlv = {n: Rates(self.caps[n]) for n in self.names}
        self.lag = dict.fromkeys(self.names, 0)  # tokens the drafter's cache is behind (after the prompt)
        self.fresh = set(self.names)  # not run in this request: its cache also lacks the prompt
        self.missing = dict.fromkeys(self.names, 0)  # prompt tokens a fresh drafter's cache lacks
        self.max_tokens = 1 << 30  # the request's own cap on what it generates
        self.used_step = dict.fromkeys(self.names, -(1 << 30))
        # the probe budget accrues with this request's own seconds, from what the engine had saved
        self.clock = 0.0
        # a drafter never run in this process: probed at once if nothing is known of it; if a loaded
        # profile measured it, its probes wait for the budget this process accrues like any other's
        # (a new process's first probes would otherwise pay a long prompt's catch-up, or displace
        # the draft model's 5-token steps with 1-token lookups, unasked)
        self.since = {n: ctl.last_used.get(n, 0.0 if n in ctl.profiled else float("-inf")) - ctl.clock
                      for n in self.names}
        self.step = self.generated = 0
        self.probing: tuple | None = None  # (drafter, whether it displaced a drafter, its plan)
        self._step_plan: tuple = (None, None)  # (drafter, plan) this step runs, for the trace
        self.pending: tuple | None = None  # (drafter, plan): a probe that found nothing, to ask again
        self.follow_up: tuple | None = None  # (drafter, successes): its last probe succeeded, probe again
        self.pred_tokens = self.pred_time = 0.0
        self._probe_cost: dict[str, float] = {}  # seconds a probe of the drafter was last expected to lose
        # plain passes' worth this request may still lose probing a draft model the engine knows little of
        self.explore_left = {n: EXPLORE_PASSES for n in self.names if n not in FREE}
        self._plans_V: list[float] | None = None  # the cost table the cached plans were made with
        self._plans: dict[str, dict[tuple, planner.Plan]] = {n: {} for n in [*self.names, HYBRID]}
        self._costs: dict[tuple[int, int], tuple[float, ...]] = {}  # (head length, k) -> seconds per draft token
        # decayed counts of the target's top probability at this request's recent tokens, by
        # ConfidenceMap bucket (sampled requests): with the engine's target map, what a draft
        # model is expected to keep here before it has drafted (_model_level)
        self._seen_top = [0.0] * len(ConfidenceMap.MIDS)
        self.covered = 0.0  # of the tokens generated, those a lookup drafted and kept or would have (_uncovered)

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.pred_tokens / self.pred_time if self.pred_time > 0 else 0.0

    # --- planning -----------------------------------------------------------------------------

    def _check_table(self, V) -> None:
        if V is not self._plans_V:  # costs moved: every cached plan is stale
            self._plans_V, self._costs = V, {}
            for plans in self._plans.values():
                plans.clear()

    @staticmethod
    def _bucket(name: str, order: int, at: int) -> int:
        """The acceptance bucket of a lookup's match offered after `at` generated tokens: REPEAT where the
        suffix drafter's match is the same request again (its earlier answer to this prompt), else
        OPENING at a request's first step, else by its length."""
        if name == SuffixDrafter.name and order >= at + SAME_REQUEST:
            return REPEAT
        return OPENING if at == 0 else match_bucket(order)

    def _lookup_rates(self, name: str, bucket: int) -> list[float]:
        return self._rates(name, bucket, self.acc_order.setdefault((name, bucket), Rates(self.caps[name])))

    def _rates(self, name: str, bucket: int, rates: Rates) -> list[float]:
        """A request's acceptance by position, leaning on the engine's pooled rate as much as
        requests were alike, each position as the engine's acceptance moves with it (Shape)."""
        q = self.ctl.prior(name, bucket, self.regime)
        mean = q[0] / q[1]
        if name == MODEL and bucket == 0:
            mean = self._model_level(mean)
        shape = self.ctl.position_shape(name, bucket, self.regime).factors(self.caps[name])
        return rates.rates(mean, self.ctl.prior_weight(name, bucket, self.regime, mean), shape)

    def _model_level(self, pooled: float) -> float:
        """The draft model's expected acceptance in this request: what the engine's target map says
        of tokens as sure as this request's recent ones, once both have seen enough (else `pooled`).

        A pooled rate is the same for a code answer, where the 0.5B keeps 0.9 of its tokens, and
        for a translation at 0.8, where it keeps about half; which kind a request is showed only
        once the draft model had paid its prompt's catch-up and drafted at a loss. How sure the
        target has been of the request's own tokens is known at every sampled step for free."""
        if sum(self._seen_top) < _SEEN_MIN:
            return pooled
        level = self.ctl.target_map(MODEL, self.regime).expected(self._seen_top)
        return pooled if level is None else level

    def _plan(self, name, V, kmin=1, kmax=None, found=False, ceiling=False) -> planner.Plan:
        """Best plan of one drafter over k in [kmin, kmax].

        found: given that the drafter returns a first token (a lookup found a match);
        ceiling: as if every draft token were accepted. Cached until V or the drafter's
        estimates change.
        """
        self._check_table(V)
        order, cap = 0, self.caps[name]
        kmax = min(kmax or cap, cap)
        if name in self.offers:  # what it would draft now is known
            order, available = self.offers[name]
            found, kmax = True, min(kmax, available)
            if not order or kmax < kmin:
                return planner.plain(V)._replace(rate=0.0)  # no match: nothing to draft
            order = self._bucket(name, order, self.generated)
        opening = not order and name not in FREE and self.generated == 0
        key = (kmin, kmax, found, ceiling, OPENING if opening else order)
        best = self._plans[name].get(key)
        if best is not None:
            return best
        if ceiling:
            acc = [1.0] * cap
        elif order:
            acc = self._lookup_rates(name, order)
        elif opening:  # the model's first draft follows the prompt: learnt apart (OPENING)
            acc = self._rates(name, OPENING, self._opening[name])
        else:
            acc = self._rates(name, 0, self.acc[name])
        p = self.ctl.prior(name, 0, self.regime)
        # a known match delivers every token up to `available`, which bounds kmax
        dlv = None if order else self.dlv[name].rates(p[2] / p[3])
        option = planner.Option(name, acc, tuple(self.ctl.draft_coef(name, V)), kmax, kmin, dlv, found)
        best = self._plans[name][key] = planner.best_length(option, V)
        return best

    def _hybrid_head(self) -> tuple[str, int, int] | None:
        """(lookup, match bucket, m): what the hybrid's lookup would draft now, if it pays to plan."""
        if any(name in self.caps and name not in self.offers for name in HYBRID_LOOKUPS):
            return None  # which lookup the hybrid follows is unknown (a caller that tells only the n-gram's offer)
        for name in HYBRID_LOOKUPS:
            order, available = self.offers.get(name, (0, 0))
            if name in self.caps and order:
                # the draft model continues only where the match runs out before the caps
                bucket = self._bucket(name, order, self.generated)
                return (name, bucket, available) if available < min(self.caps[name], self.cap) else None
        return None

    def _plan_hybrid(self, V) -> planner.Plan | None:
        head = self._hybrid_head()
        if head is None:
            return None
        name, bucket, m = head
        self._check_table(V)
        best = self._plans[HYBRID].get(head)
        if best is None:
            p = self.ctl.prior(MODEL, 0, self.regime)
            jmax = min(self.caps[MODEL], self.cap - m)
            option = planner.Option(HYBRID, self._rates(MODEL, 0, self.acc[MODEL]),
                                    tuple(self.ctl.draft_coef(MODEL, V)), jmax, 1,
                                    self.dlv[MODEL].rates(p[2] / p[3]), False,
                                    self._lookup_rates(name, bucket)[:m])
            best = self._plans[HYBRID][head] = planner.best_length(option, V)
        return best

    def _best(self, V) -> tuple[str | None, planner.Plan, float]:
        """(drafter, plan, rate after catch-up) of the best choice this step. A draft model's
        prompt catch-up is spread over the tokens it may draft for, not the lookups' (_uncovered)."""
        uncovered = self._uncovered()
        plans = [(n, self._plan(n, V, kmin=self.kmin[n]), self._catchup(n, V, uncovered)) for n in self.names]
        if self.hybrid:
            hybrid = self._plan_hybrid(V)
            if hybrid is not None:
                plans.append((HYBRID, hybrid, self._catchup(MODEL, V, uncovered)))
        return planner.pick(V, plans, self._horizon())

    def _stop_rule(self, name: str, plan: planner.Plan, V) -> planner.ConfidenceStop | None:
        """The draft model's confidence stop for this step's plan (None: it does not draft)."""
        if name == HYBRID:
            m = plan.m
            head = self._lookup_rates(self._step_head[0], self._step_head[1])[:m]
            tokens, chain = 1.0, 1.0
            for x in head:
                chain *= x
                tokens += chain
            kmin = 0
        elif name == MODEL:
            m, tokens, chain, kmin = 0, 1.0, 1.0, self.kmin[MODEL]
        else:
            return None
        a, b, c = self.ctl.draft_coef(MODEL, V)
        costs = self._costs.get((m, plan.k))
        if costs is None:
            costs = self._costs[m, plan.k] = planner.step_costs(V, b, m, plan.k - m)
        table = self.ctl.confidence_map(MODEL, self.regime).table()
        return planner.ConfidenceStop(table, ConfidenceMap.EDGES, costs, tokens, a + c * m + V[m + 1], chain, kmin)

    # --- the engine's calls (observe, prefill, prefilled, finish: learning.py, prefill.py) ------

    def see(self, name: str, offer: tuple[int, int]) -> None:
        """What a lookup drafter would draft this step: its match length (0: none), tokens available."""
        if name in self.caps:
            self.offers[name] = (int(offer[0]), int(offer[1]))  # plans are cached by match and length

    def plan(self) -> tuple[str | None, planner.Plan | None]:
        """The planner's choice now, before any probe: (drafter or None, its plan); None for the
        plan before any pass was measured. What choose returns unless a probe is due."""
        with self.ctl.lock:
            V = self.ctl.verify.table(self.cap + 1)
            return (None, None) if V is None else self._best(V)[:2]

    def choose(self) -> Choice:
        with self.ctl.lock:
            return self._choose()

    def _choose(self) -> Choice:
        self.step += 1
        self.probing = None
        self._step_plan = (None, None)
        self._step_offers = dict(self.offers)
        self._step_at = self.generated  # at the request's first step its lookups match the prompt's end
        self._step_head = self._hybrid_head() if self.hybrid else None
        # the grammar's forced run is drafted first whatever the plan: free to draft, kept by construction
        forced = self.offers.get(FORCED, (0, 0))[1]
        V = self.ctl.verify.table(self.cap + 1)  # [cap + 2] seconds per pass over n tokens
        if V is None:  # the first step of a fresh engine measures a plain pass (or the forced run's)
            return Choice(FORCED, forced) if forced else OFF
        name, plan, rate = self._best(V)
        pending, self.pending = self.pending, None
        # the same request again is copied, never displaced by a probe: while the copy holds, nothing a
        # probe shows would be used (a probe's budget had let a repeat's first step go to the draft model)
        copying = name == SuffixDrafter.name and self._repeating()
        for other in self.names:
            if other == name or copying:
                continue
            probe = pending[1] if pending and pending[0] == other and not plan.k else self._probe(other, V, rate)
            if probe:
                self.probing = (other, plan.k > 0, probe)
                name, plan = other, probe
                break
        self.pred_tokens += plan.tokens
        self.pred_time += plan.seconds
        self._step_plan = (name, plan)
        if not plan.k or name == FORCED:
            return Choice(FORCED, forced) if forced else OFF
        # the drafter's own k after the forced run (drafters.forced.ForcedThen); learning.py parts them
        return Choice(name, plan.k + forced, self._stop_rule(name, plan, V))

    def _trace(self, o: Outcome) -> None:
        """The step as planned and as it went, for SPECSERVE_LOG=debug."""
        if not trace.isEnabledFor(logging.DEBUG):
            return
        name, plan = self._step_plan
        planned = (f"{name or 'plain'} k={plan.k} rate {plan.rate:.2f} tok/s ({plan.tokens:.2f} tokens in {plan.seconds:.3f} s)"
                   if plan else "plain (measuring)")
        lookup = self._step_head[0] if name == HYBRID and self._step_head else name
        if lookup in self._step_offers:  # what the lookup matched: its length, and the tokens it had
            planned += " (match %d, %d available)" % self._step_offers[lookup]
        probe = f" probe of {self.probing[0]}" if self.probing else ""
        offers = " ".join(f"{d}:{o[0]}/{o[1]}" for d, o in self._step_offers.items())
        rates = " ".join(f"{d}:{r.rate:.2f}" for d, r in self.acc.items() if r.rate is not None)
        trace.debug("step %d T%s: planned %s%s; ran %s k=%d drafted %d accepted %d; draft %.3f s verify %.3f s; "
                    "lags %s; acceptance so far %s; offers %s", self.step, self.regime, planned, probe,
                    o.choice.drafter if o.choice.k else "plain", o.choice.k, o.n_drafted, o.n_accepted,
                    o.t_draft, o.t_verify, dict(self.lag), rates or "-", offers or "-")

    def _forget_plans(self, *names: str) -> None:
        """Their estimates changed: their cached plans, and the hybrid's, are stale."""
        for name in names:
            self._plans[name].clear()
        self._plans[HYBRID].clear()
