"""When an unused drafter is tried again: probes.

A drafter not in use (a draft model; a lookup only until the engine has judged it unasked)
is probed with a short draft once the steps since its last use reach an interval (doubled
after a failure, up to PROBE_MAX) and the probe's expected loss, catch-up included, fits in
_EPS of the decode time since the drafter last ran (in this request, plus what the engine
saved before it). A drafter never run in this process is probed at once if nothing is known
of it; if a loaded profile measured it, its budget counts from the process's start. A fully
accepted probe is followed up at once, a few times (learning.py sets the next interval); one
whose catch-up cost is still unknown, while its lag is short; one that could not pay even at
100% acceptance, at 1/8 of the budget. Those outside the budget wait while even 100% acceptance would
not beat the plan in hand (they would show nothing that changes the step's choice). The hybrid is never
probed: its parts are.

While the engine has judged few of a draft model's tokens at the request's temperature, a request
may also spend up to EXPLORE_PASSES plain passes' worth on probing it (`_explore`): from an empty
profile, two failed drafts at an answer's start pulled the draft model below what pays, and its
catch-up, growing by a token a token, soon outpriced the 1% budget for the rest of the request, so
a pair that keeps 95% of code ran without it. The allowance shrinks as the engine's evidence there
grows and is gone at EXPLORE_N judged tokens; a loaded profile's evidence counts.
"""
from __future__ import annotations

from .names import FREE
from . import planner

_EPS = 0.01  # share of decode time that probes may lose
PROBE_MIN, PROBE_MAX = 4, 32  # steps between probes of an unused drafter
FOLLOW_UPS = 6  # successful probes in a row that may bypass the budget
EXPLORE_PASSES = 3.0  # plain passes' worth a request may lose probing a draft model the engine knows little of
EXPLORE_OWN = 8.0  # judged tokens of the request's own beyond which it has seen enough to go by
EXPLORE_N = 48.0  # (decayed) judged tokens of the engine's at a temperature beyond which that allowance is gone


class Probing:
    """AutoPolicy's probes (request.py holds the state they read)."""

    def _probe(self, name: str, V, best_rate: float) -> planner.Plan | None:
        """The plan of a short probe of `name`, if one is due now."""
        ctl = self.ctl
        if name in self.offers and not self.offers[name][0]:
            return None  # nothing to probe with
        if name in ctl.shadowed:
            return None  # judged at every step where it matches, unasked: nothing a probe would add
        if self.step - self.used_step[name] < ctl.interval.get(name, PROBE_MIN):
            return None
        earned = _EPS * (self.clock - self.since[name])
        budget = earned + self._explore(name, V)
        k, fit = self.kmin[name], ctl.draft.get(name)
        # what catching up costs is unknown until lags vary: look while the lag is short and cheap
        # (never while its cache lacks this request's prompt: that catch-up is what makes a probe costly)
        early = (name not in FREE and name not in self.fresh and fit is not None and not fit.lag_known()
                 and self.lag[name] <= 2 * PROBE_MIN)
        if early or self.follow_up and self.follow_up[0] == name:  # outside the budget, but
            if best_rate * V[1] > 1.0 and not self._could_pay(name, V, best_rate):
                # not where it would lose to the plan in hand even keeping every token it drafts (a lookup
                # copying 64 tokens a pass): nothing it shows would change this step's choice. A repeat's
                # first steps had gone to a 1-token probe of the draft model and its follow-ups, each in
                # place of a 64-token copy
                return None
        else:
            if budget < self._probe_cost.get(name, 0.0):
                return None  # below the cost last computed (a lagging cache only adds to it)
            # seconds a probe that drafts loses against the best choice making its expected tokens
            p = self._plan(name, V, kmin=k, kmax=k, found=True)
            cost = self._catchup(name, V) + p.seconds - p.tokens / best_rate
            if not self._could_pay(name, V):
                cost *= 8  # only to refresh what it costs, rarely
            self._probe_cost[name] = cost
            if budget < cost:
                return None
            if cost > earned:  # spent from the allowance
                self.explore_left[name] -= (cost - earned) / V[1]
        return self._plan(name, V, kmin=k, kmax=k)

    def _could_pay(self, name: str, V, rate: float | None = None) -> bool:
        """Whether the drafter would beat `rate` (default: plain decoding's) if every token it drafted
        were accepted."""
        return self._plan(name, V, kmin=self.kmin[name], found=True, ceiling=True).rate > (rate or 1.0 / V[1])

    def _explore(self, name: str, V) -> float:
        """Seconds this request may still lose probing a draft model beyond the 1% budget, while the
        engine has judged few of its tokens at this temperature (none for a lookup, judged unasked: it has
        no entry in explore_left)."""
        left = self.explore_left.get(name, 0.0)
        if left <= 0.0:
            return 0.0
        judged = self.ctl.prior(name, 0, self.regime)[1]  # with the prior's own pseudo-trials
        own = self.acc[name].t  # this request's own judged tokens (decayed): what it has already seen
        return left * max(0.0, 1.0 - judged / EXPLORE_N) * max(0.0, 1.0 - own / EXPLORE_OWN) * V[1]
