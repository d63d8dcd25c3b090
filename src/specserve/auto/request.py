"""One request's `--spec auto` policy: the per-request bookkeeping around the planner.

Each step it turns what it knows into planner options (planner.py) and takes the plan with
the most expected tokens per second. It is composed of parts that own their state: its
acceptance estimates (estimates.py), its drafters' lags (lags.py), its probes (probing.py), its
prefill judgement (prefill.py) and its plan cache (plans.py); what each step's outcome teaches
them is learning.py's. The parts are made with one Context (context.py); what probing and
prefill need of the planning here they are handed as functions (plan_for, best), not the policy.
How auto decides, with measurements: docs/auto.md.

The engine tells it, each step, what each lookup drafter would match (`see`), so a lookup is
planned only when it has a match, up to what it has. With a draft model and a lookup, the
hybrid (drafters.hybrid) is planned too: the lookup's m tokens, then the draft model from
where they end; it is planned only when a lookup matches fewer tokens than its cap.
Switching on a lagging drafter charges its catch-up over the tokens the request is still
expected to make.

Threads: a policy is used by one thread; every method that touches the shared Controller
holds its lock for the whole call (see controller.py). It sees the Controller through the
`Shared` protocol (shared.py), so that nothing here imports the module that makes it.
"""
from __future__ import annotations

import logging
from typing import Sequence

from ..config import SpecParams
from ..drafters.suffix import SuffixDrafter
from ..policy import OFF, Choice, Outcome
from . import planner
from .acceptance import OPENING, ConfidenceMap
from .context import Context
from .estimates import bucket
from .hot import HOT
from .learning import Learner
from .names import FORCED, FREE, HYBRID, HYBRID_LOOKUPS, MODEL
from .plans import PlanCache
from .draft_prefill import Gain, Prefill
from .probing import EXPLORE_PASSES, Probes
from .request_state import Setup
from .shared import Shared

trace = logging.getLogger("specserve.auto")  # one DEBUG line a step: SPECSERVE_LOG=debug
REENTRY_LAG = 8  # tokens the draft model's cache lags by, beyond which a step that runs it is judged as a probe


class AutoPolicy:
    """One request's adaptive policy; see the module docstring."""

    sees_offers = True  # the engine tells it, each step, what each lookup drafter would match: see(name, offer)

    def __init__(self, ctl: Shared, spec: SpecParams, names: list[str], temperature: float = 0.0,
                 prefill_gain: Gain | None = None, prompt: Sequence[int] | None = None):
        """Made by Controller.policy, under its lock. prefill_gain: how a prompt catch-up up front is
        priced (prefill.spread_gain unless given); prompt: the request's tokens (its kind: kinds.py)."""
        self.ctl = ctl
        self.setup = setup = Setup.of(spec, names, temperature, prompt)
        self.names, self.hybrid, self.caps, self.cap = setup.names, setup.hybrid, setup.caps, setup.cap
        self.regime = setup.regime
        self.ctx = ctx = Context.of(ctl, setup)
        self.progress, self.est, self.lags = ctx.progress, ctx.est, ctx.lags
        self.cache = PlanCache(setup.names)
        self.probes = Probes(ctx, self.plan_for, self.best, EXPLORE_PASSES)
        self.prefills = Prefill(ctx, self.plan_for, prefill_gain)
        self.probes.uncovered = self.prefills.uncovered
        self.learner = Learner(ctx, self.probes, self.cache)
        # this step as chosen: the lookups' offers, tokens made before it (0: the request's first
        # step), a hybrid's (lookup, match bucket, m), and (drafter, plan) for the trace
        self._step_offers: dict[str, tuple[int, int]] = {}
        self._step_at = 0
        self._step_head: tuple[str, int, int] | None = None
        self._step_plan: tuple = (None, None)
        self._options = self._step_options = (None, [])  # what best() weighed: the value of a second, the plans
        self.pred_tokens = self.pred_time = 0.0

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.pred_tokens / self.pred_time if self.pred_time > 0 else 0.0

    # --- planning -----------------------------------------------------------------------------

    def plan_for(self, name, V, kmin=1, kmax=None, found=False, ceiling=False, hopeful=False) -> planner.Plan:
        """Best plan of one drafter over k in [kmin, kmax].

        found: given that the drafter returns a first token (a lookup found a match);
        ceiling: as if every draft token were accepted; hopeful: a draft model's rates as high as the
        request's evidence allows (Estimates.optimistic). Cached until V or the drafter's estimates change.
        """
        self.cache.check(V)
        order, cap, at = 0, self.caps[name], self.progress.generated
        kmax = min(kmax or cap, cap)
        if name in self.progress.offers:  # what it would draft now is known
            order, available = self.progress.offers[name]
            found, kmax = True, min(kmax, available)
            if not order or kmax < kmin:
                return planner.plain(V)._replace(rate=0.0)  # no match: nothing to draft
            order = bucket(name, order, at)
        opening = not order and name not in FREE and at == 0
        key = (kmin, kmax, found, ceiling, OPENING if opening else order, hopeful)
        best = self.cache.plans[name].get(key)
        if best is not None:
            return best
        if ceiling:
            acc = [1.0] * cap
        elif order:
            acc = self.est.lookup(name, order)
        elif opening:  # the model's first draft follows the prompt: learnt apart (OPENING)
            acc = self.est.rates(name, OPENING, self.est.opening[name])
        else:
            acc = self.est.rates(name, 0, self.est.acc[name])
            if hopeful:
                acc = self.est.optimistic(name, acc)
        p = self.ctl.priors.prior(name, 0, self.setup.kind)
        # a known match delivers every token up to `available`, which bounds kmax
        dlv = None if order else self.est.dlv[name].rates(p[2] / p[3])
        option = planner.Option(name, acc, tuple(self.ctl.costs.draft_coef(name, V)), kmax, kmin, dlv, found)
        best = self.cache.plans[name][key] = planner.best_length(option, V)
        return best

    def _hybrid_head(self) -> tuple[str, int, int] | None:
        """(lookup, match bucket, m): what the hybrid's lookup would draft now, if it pays to plan."""
        if any(name in self.caps and name not in self.progress.offers for name in HYBRID_LOOKUPS):
            return None  # which lookup the hybrid follows is unknown (a caller that tells only the n-gram's offer)
        for name in HYBRID_LOOKUPS:
            order, available = self.progress.offers.get(name, (0, 0))
            if name in self.caps and order:
                # the draft model continues only where the match runs out before the caps
                b = bucket(name, order, self.progress.generated)
                return (name, b, available) if available < min(self.caps[name], self.cap) else None
        return None

    def _plan_hybrid(self, V) -> planner.Plan | None:
        head = self._hybrid_head()
        if head is None:
            return None
        name, b, m = head
        self.cache.check(V)
        best = self.cache.plans[HYBRID].get(head)
        if best is None:
            p = self.ctl.priors.prior(MODEL, 0, self.setup.kind)
            jmax = min(self.caps[MODEL], self.cap - m)
            option = planner.Option(HYBRID, self.est.rates(MODEL, 0, self.est.acc[MODEL]),
                                    tuple(self.ctl.costs.draft_coef(MODEL, V)), jmax, 1,
                                    self.est.dlv[MODEL].rates(p[2] / p[3]), False, self.est.lookup(name, b)[:m])
            best = self.cache.plans[HYBRID][head] = planner.best_length(option, V)
        return best

    def best(self, V) -> tuple[str | None, planner.Plan, float]:
        """(drafter, plan, rate after catch-up) of the best choice this step, by what it makes less what
        its seconds would make at the request's rate so far (planner.pick). A draft model's prompt
        catch-up is spread over the tokens it may draft for, not the lookups' (prefill.py); its catch-up
        on the tokens the lookups made since it last ran is the step's own while a copy is on (their next
        run makes it again), and otherwise shared by the run it starts (as long as the stretch without a
        copy has lasted: a step pays its tokens' share of it).

        The rate so far prices a second while a copy is on (a plain step may let it resume). Otherwise a
        second is worth at most what the best option makes now (planner.steady): a good start (the draft
        model keeping all of its first drafts) had set the price above every option, and then a plain
        step, shorter, lost the least at it, step after step, while the draft model's catch-up grew."""
        uncovered, kmin, lags = self.prefills.uncovered(), self.setup.kmin, self.lags
        progress = self.progress
        value = planner.worth(*(progress.since_copy or (progress.generated, progress.clock)), V)
        plans = [(n, self.plan_for(n, V, kmin=kmin[n]), lags.start(n, uncovered), lags.owed(n, V))
                 for n in self.names]
        if self.hybrid:
            hybrid = self._plan_hybrid(V)
            if hybrid is not None:
                plans.append((HYBRID, hybrid, lags.start(MODEL, uncovered), lags.owed(MODEL, V)))
        if not progress.copying:
            # no copy to resume: a draft model that runs now runs on, and its catch-up on what others made
            # is repaid over that run, expected as long as the stretch without a copy has lasted (a step's
            # share: its tokens over the stretch's)
            spell = progress.since_copy[0] if progress.since_copy else progress.generated
            plans = [(n, p, start, sum(owed) * min(1.0, p.tokens / spell) if spell > 0 else sum(owed))
                     for n, p, start, *owed in plans]
            if value is not None:
                value = min(value, planner.steady(V, plans))
        self._options = (value, plans)  # for the trace
        name, plan, rate = planner.pick(V, plans, self.prefills.horizon(), value)
        if name is None and MODEL in self.names and self.setup.regime < HOT and not progress.copying:
            # plain decoding learns nothing of the draft model: where it may yet win, it drafts (at its plan's k)
            _, own, *catchup = plans[self.names.index(MODEL)]
            hopeful = self.plan_for(MODEL, V, kmin=kmin[MODEL], hopeful=True)
            if planner.pick(V, [(MODEL, hopeful, *catchup)], self.prefills.horizon(), value)[0]:
                return MODEL, own, own.tokens / own.seconds
        return name, plan, rate

    def _stop_rule(self, name: str, plan: planner.Plan, V) -> planner.ConfidenceStop | None:
        """The draft model's confidence stop for this step's plan (None: it does not draft)."""
        if name == HYBRID:
            m = plan.m
            head = self.est.lookup(self._step_head[0], self._step_head[1])[:m]
            tokens, chain = 1.0, 1.0
            for x in head:
                chain *= x
                tokens += chain
            kmin = 0
        elif name == MODEL:
            m, tokens, chain, kmin = 0, 1.0, 1.0, self.setup.kmin[MODEL]
        else:
            return None
        a, b, c = self.ctl.costs.draft_coef(MODEL, V)
        costs = self.cache.step_costs(V, b, m, plan.k)
        table = self.ctl.priors.confidence_map(MODEL, self.setup.regime).table()
        return planner.ConfidenceStop(table, ConfidenceMap.EDGES, costs, tokens, a + c * m + V[m + 1], chain, kmin)

    # --- the engine's calls ---------------------------------------------------------------------

    def see(self, name: str, offer: tuple[int, int]) -> None:
        """What a lookup drafter would draft this step: its match length (0: none), tokens available."""
        if name in self.caps:
            self.progress.offers[name] = (int(offer[0]), int(offer[1]))  # plans are cached by match and length

    def plan(self) -> tuple[str | None, planner.Plan | None]:
        """The planner's choice now, before any probe: (drafter or None, its plan); None for the
        plan before any pass was measured. What choose returns unless a probe is due."""
        with self.ctl.lock:
            V = self.ctl.costs.verify.table(self.cap + 1)
            return (None, None) if V is None else self.best(V)[:2]

    def choose(self) -> Choice:
        with self.ctl.lock:
            return self._choose()

    def _choose(self) -> Choice:
        probes = self.probes
        self.progress.step += 1
        probes.probing = None
        self._step_plan = (None, None)
        self._step_offers = dict(self.progress.offers)
        self._step_at = self.progress.generated  # at the request's first step its lookups match the prompt's end
        self._step_head = self._hybrid_head() if self.hybrid else None
        # the grammar's forced run is drafted first whatever the plan: free to draft, kept by construction
        forced = self.progress.offers.get(FORCED, (0, 0))[1]
        V = self.ctl.costs.verify.table(self.cap + 1)  # [cap + 2] seconds per pass over n tokens
        if V is None:  # the first step of a fresh engine measures a plain pass (or the forced run's)
            return Choice(FORCED, forced) if forced else OFF
        name, plan, rate = self.best(V)
        self._step_options = self._options
        pending, probes.pending = probes.pending, None
        # the same request again is copied, never displaced by a probe: while the copy holds, nothing a
        # probe shows would be used (a probe's budget had let a repeat's first step go to the draft model)
        copying = name == SuffixDrafter.name and self.prefills.repeating()
        for other in self.names:
            if other == name or copying:
                continue
            probe = pending[1] if pending and pending[0] == other and not plan.k else probes.due(other, V, rate)
            if probe:
                probes.probing = (other, plan.k > 0, probe)
                name, plan = other, probe
                break
        if (probes.probing is None and name == MODEL and plan.k and self.lags.lag[MODEL] > REENTRY_LAG
                and not self.progress.copying):
            # back after a stretch without it, on a catch-up its plan priced as the stretch's: judged as a
            # probe is (a success is followed up), so that one step at an estimate still low does not end
            # the run the catch-up was paid for
            probes.probing = (MODEL, True, plan)
        self.pred_tokens += plan.tokens
        self.pred_time += plan.seconds
        self._step_plan = (name, plan)
        if not plan.k or name == FORCED:
            return Choice(FORCED, forced) if forced else OFF
        # the drafter's own k after the forced run (drafters.forced.ForcedThen); learning.py parts them
        return Choice(name, plan.k + forced, self._stop_rule(name, plan, V))

    def observe(self, o: Outcome) -> None:
        with self.ctl.lock:
            self._trace(o)
            self.learner.observe(o, self._step_offers, self._step_at, self._step_head)

    def prefill(self, name: str, n_missing: int, max_tokens: int) -> bool:
        """Whether a model drafter should take the prompt before the first step (prefill.py)."""
        took = self.prefills.prefill(name, n_missing, max_tokens)
        if took and self.setup.regime >= HOT:
            self.probes.owed.add(name)  # the prompt was taken on what the drafter may keep: find out (hot.py)
        return took

    def prefilled(self, name: str, n_tokens: int, seconds: float) -> None:
        self.prefills.prefilled(name, n_tokens, seconds)

    def finish(self) -> None:
        """The request ended: what it learnt goes to the engine (Estimates.report), with its length
        and the share of it the lookups covered."""
        with self.ctl.lock:
            self.est.report()
            self.ctl.learn_length(self.progress.generated)
            if self.setup.has_lookups:
                self.ctl.learn_lookup_share(self.setup.kind, self.progress.covered, self.progress.generated)
            V = self.ctl.costs.verify.table(self.cap + 1)
            if V is not None:
                self.ctl.learn_speedup(self.setup.kind, self.progress.generated, self.progress.clock / V[1])

    def _trace(self, o: Outcome) -> None:
        """The step as planned and as it went, for SPECSERVE_LOG=debug."""
        if not trace.isEnabledFor(logging.DEBUG):
            return
        name, plan = self._step_plan
        planned = (f"{name or 'plain'} k={plan.k} rate {plan.rate:.2f} tok/s "
                   f"({plan.tokens:.2f} tokens in {plan.seconds:.3f} s)" if plan else "plain (measuring)")
        lookup = self._step_head[0] if name == HYBRID and self._step_head else name
        if lookup in self._step_offers:  # what the lookup matched: its length, and the tokens it had
            planned += " (match %d, %d available)" % self._step_offers[lookup]
        probing = self.probes.probing
        probe = f" probe of {probing[0]}" if probing else ""
        offers = " ".join(f"{d}:{o[0]}/{o[1]}" for d, o in self._step_offers.items())
        # each option weighed: tokens / seconds + the prompt's catch-up (before spreading) + the catch-up owed
        value, plans = self._step_options
        weighed = " ".join(f"{n}:{p.tokens:.2f}/{p.seconds:.3f}+{start:.3f}+{sum(owed):.3f}"
                           for n, p, start, *owed in plans if p.k)
        rates = " ".join(f"{d}:{r.rate:.2f}" for d, r in self.est.acc.items() if r.rate is not None)
        trace.debug("step %d T%s: planned %s%s; ran %s k=%d drafted %d accepted %d; draft %.3f s verify %.3f s; "
                    "lags %s; acceptance so far %s; offers %s; a second worth %s, weighed %s",
                    self.progress.step, self.setup.regime, planned, probe,
                    o.choice.drafter if o.choice.k else "plain", o.choice.k, o.n_drafted, o.n_accepted,
                    o.t_draft, o.t_verify, dict(self.lags.lag), rates or "-", offers or "-",
                    f"{value:.2f}" if value else "-", weighed or "-")
