"""When an unused drafter is tried again: probes.

A drafter not in use (a draft model; a lookup only until the engine has judged it unasked)
is probed with a short draft once the steps since its last use reach an interval (doubled
after a failure, up to pacing.PROBE_MAX) and the probe's expected loss, catch-up included, fits in
_EPS of the decode time since the drafter last ran (in this request, plus what the engine
saved before it). A drafter never run in this process is probed at once if nothing is known
of it; if a loaded profile measured it, its budget counts from the process's start. A fully
accepted probe is followed up at once, a few times (Probes.judged sets the next interval); one
whose catch-up cost is still unknown, while its lag is short; one that could not pay even at
100% acceptance, at 1/8 of the budget. Those outside the budget wait while even 100% acceptance would
not beat the plan in hand (they would show nothing that changes the step's choice). The hybrid is never
probed: its parts are.

While the engine has judged few of a draft model's tokens at the request's temperature, a request
may also spend up to EXPLORE_PASSES plain passes' worth on probing it (`explore`), so that a few
failed drafts at an answer's start cannot switch a good draft model off for the request (why:
docs/auto-history.md). The allowance shrinks as the engine's evidence there grows and is gone at
EXPLORE_N judged tokens; a loaded profile's evidence counts.
"""
from __future__ import annotations

from typing import Callable, Protocol

from . import hot, planner
from .context import Context
from .names import FREE, HYBRID_LOOKUPS as LOOKUPS
from .pacing import PROBE_MIN

_EPS = 0.01  # share of decode time that probes may lose
FOLLOW_UPS = 6  # successful probes in a row that may bypass the budget
EXPLORE_PASSES = 3.0  # plain passes' worth a request may lose probing a draft model the engine knows little of
EXPLORE_OWN = 8.0  # judged tokens of the request's own beyond which it has seen enough to go by
EXPLORE_N = 48.0  # (decayed) judged tokens of the engine's at a temperature beyond which that allowance is gone


class PlanFor(Protocol):
    """The request's best plan of one drafter (request.AutoPolicy.plan_for), which a probe is priced with."""

    def __call__(self, name: str, V, kmin: int = 1, kmax: int | None = None, found: bool = False,
                 ceiling: bool = False) -> planner.Plan: ...


Best = Callable[[list], "tuple[str | None, planner.Plan, float]"]  # the request's choice now (AutoPolicy.best)


class Probes:
    """When one request tries an unused drafter again, and what its probes showed."""

    def __init__(self, ctx: Context, plan_for: PlanFor, best: Best, explore: float = EXPLORE_PASSES):
        """plan_for, best: the request's planning, which prices a probe and tells whether one paid."""
        ctl, setup = ctx.ctl, ctx.setup
        self.ctl, self.setup, self.progress, self.est, self.lags = ctl, setup, ctx.progress, ctx.est, ctx.lags
        self.plan_for, self.best = plan_for, best
        names = setup.names
        # a drafter never run in this process: probed at once if nothing is known of it; if a loaded
        # profile measured it, its probes wait for the budget this process accrues like any other's
        # (a new process's first probes would otherwise pay a long prompt's catch-up, or displace
        # the draft model's 5-token steps with 1-token lookups, unasked)
        pacing = ctl.pacing
        self.since = {n: pacing.last_used.get(n, 0.0 if n in pacing.profiled else float("-inf")) - pacing.clock
                      for n in names}  # the request's clock when each last drafted
        self.used_step = dict.fromkeys(names, -(1 << 30))
        self.probing: tuple | None = None  # (drafter, whether it displaced a drafter, its plan) this step
        self.pending: tuple | None = None  # (drafter, plan): a probe that found nothing, to ask again
        self.follow_up: tuple | None = None  # (drafter, successes): its last probe succeeded, probe again
        self.cost: dict[str, float] = {}  # seconds a probe of the drafter was last expected to lose
        # plain passes' worth this request may still lose probing a draft model the engine knows little of
        self.explore_left = {n: explore for n in names if n not in FREE}
        self._may_pay: tuple = (None, True)  # (key, hot.may_pay): may_pay's last answer
        self.owed: set[str] = set()  # drafters that took the prompt up front on a bet, not yet judged: probed
        # the share of the request's tokens its lookups are not expected to cover (draft_prefill.Prefill.uncovered):
        # all a draft model could ever draft for, which is all that exploring it may find
        self.uncovered: Callable[[], float] = lambda: 1.0

    def due(self, name: str, V, best_rate: float) -> planner.Plan | None:
        """The plan of a short probe of `name`, if one is due now."""
        ctl, offers = self.ctl, self.progress.offers
        if name in offers and not offers[name][0]:
            return None  # nothing to probe with
        if name in ctl.pacing.shadowed or name in LOOKUPS and ctl.pacing.shadowed:
            # judged at every step where it matches, unasked: nothing a probe would add. Where the engine
            # judges one lookup so, it judges them all (a suffix matching only a story's opening had been
            # probed at each story's first step, a 2-token pass at 1.7 plain ones for its 1 token)
            return None
        if self.progress.step - self.used_step[name] < ctl.pacing.probe_interval(name):
            return None
        if name in self.owed:
            self.owed.discard(name)  # once: what it shows is then the request's own evidence
            return self.plan_for(name, V, kmin=self.probe_k(name, V), kmax=self.probe_k(name, V))
        earned = _EPS * (self.progress.clock - self.since[name])
        budget = earned + self.explore(name, V)
        fit = ctl.costs.draft.get(name)
        # what catching up costs is unknown until lags vary: look while the lag is short and cheap
        # (never while its cache lacks this request's prompt: that catch-up is what makes a probe costly)
        early = (name not in FREE and name not in self.lags.fresh and fit is not None and not fit.lag_known()
                 and self.lags.lag[name] <= 2 * PROBE_MIN)
        if early or self.follow_up and self.follow_up[0] == name:  # outside the budget, but
            if best_rate * V[1] > 1.0 and not self.could_pay(name, V, best_rate):
                # not where it would lose to the plan in hand even keeping every token it drafts (a lookup
                # copying 64 tokens a pass): nothing it shows would change this step's choice
                return None
            k = self.probe_k(name, V)
        else:
            if budget < self.cost.get(name, 0.0):
                return None  # below the cost last computed (a lagging cache only adds to it)
            k = self.probe_k(name, V)
            # seconds a probe that drafts loses against the best choice making its expected tokens
            p = self.plan_for(name, V, kmin=k, kmax=k, found=True)
            cost = self.lags.catchup(name, V) + p.seconds - p.tokens / best_rate
            if not self.could_pay(name, V):
                cost *= 8  # only to refresh what it costs, rarely
            self.cost[name] = cost
            if budget < cost:
                return None
            if cost > earned:  # spent from the allowance
                self.explore_left[name] -= (cost - earned) / V[1]
        return self.plan_for(name, V, kmin=k, kmax=k)

    def probe_k(self, name: str, V) -> int:
        """Tokens a probe of `name` drafts: a lookup's least (kmin), a draft model's fewest from kmin that
        could beat plain decoding if all were kept: where a 2-token pass costs 1.7 plain ones (sampling
        hot on the reference pair; through a server on 2026-12-07's machine at any temperature), a
        1-token probe shows nothing the plan could use."""
        k = self.setup.kmin[name]
        if name in FREE:
            return k
        for j in range(k, self.setup.caps[name] + 1):
            if self.plan_for(name, V, kmin=j, kmax=j, found=True, ceiling=True).rate * V[1] > 1.0:
                return j
        return k

    def could_pay(self, name: str, V, rate: float | None = None) -> bool:
        """Whether the drafter would beat `rate` (default: plain decoding's) if every token it drafted
        were accepted."""
        plan = self.plan_for(name, V, kmin=self.setup.kmin[name], found=True, ceiling=True)
        return plan.rate > (rate or 1.0 / V[1])

    def explore(self, name: str, V) -> float:
        """Seconds this request may still lose probing a draft model beyond the 1% budget, while the
        engine has judged few of its tokens at this temperature (none for a lookup, judged unasked: it has
        no entry in explore_left)."""
        left = self.explore_left.get(name, 0.0)
        if left <= 0.0:
            return 0.0
        if self.setup.regime >= hot.HOT and not self.may_pay(name, V):
            self.explore_left[name] = 0.0  # sampling hot, what the engine saw of the kind rules it out (hot.py)
            return 0.0
        judged = self.ctl.priors.prior(name, 0, self.setup.kind)[1]  # with the prior's own pseudo-trials
        own = self.est.acc[name].t  # this request's own judged tokens (decayed): what it has already seen
        return left * self.uncovered() * max(0.0, 1.0 - judged / EXPLORE_N) * max(0.0, 1.0 - own / EXPLORE_OWN) * V[1]

    def may_pay(self, name: str, V) -> bool:
        """hot.may_pay, once for each V and pooled count of the drafter at the kind."""
        key = (name, id(V), *self.ctl.priors.prior(name, 0, self.setup.kind)[:2])
        if self._may_pay[0] != key:
            self._may_pay = (key, hot.may_pay(self.ctl, self.setup, self.est, name, V))
        return self._may_pay[1]

    def drafted(self, name: str, displaced: bool = True) -> None:
        """The drafter drafted this step (`displaced`: not a probe that found nothing to draft)."""
        if displaced:
            self.ctl.drafted_with(name)
            self.since[name] = self.progress.clock

    def judged(self, used: str, n: int, acc: int) -> None:
        """The step's drafter was judged (n drafted, acc kept): if it was a probe, pace the next."""
        self.cost.pop(used, None)
        if self.probing is None:
            self.used_step[used] = self.progress.step
            return
        probed, displaced, plan = self.probing
        if not n and not displaced:
            self.pending = (probed, plan)  # no match: nothing lost, ask again next step
            return
        self.used_step[used] = self.progress.step
        if n:
            V = self.ctl.costs.verify.table(self.setup.cap + 1)
            done = self.follow_up[1] if self.follow_up and self.follow_up[0] == probed else 0
            # all accepted: followed up at once, outside the budget, a few times at most
            good = acc == n and done < FOLLOW_UPS and self.could_pay(probed, V)
            if good and self.setup.regime >= hot.HOT and probed not in FREE:
                good = self.may_pay(probed, V)  # sampling hot, kept tokens are news only where it may pay
            self.ctl.learn_probe(probed, good or self.best(V)[0] == probed)
            self.follow_up = (probed, done + 1) if good else None
