"""What one step's outcome teaches a request's `--spec auto` policy, and the engine's pooled state.

A step's Outcome goes to each part that learns from it: the engine's counts (pass costs, pooled
acceptance and delivery, the draft model's confidence maps, drafting costs: the Controller's
learn_* verbs), the request's estimates (estimates.py), its drafters' lags (lags.py) and its
probe pacing (probing.py). A hybrid step teaches the lookup about its m tokens and the draft model
about the rest. A grammar's forced run that led the draft (drafters.forced) is nobody's: the
drafter is judged on its own tokens after it.
"""
from __future__ import annotations

from ..policy import Outcome
from .acceptance import OPENING
from .context import Context
from .estimates import bucket
from .names import FREE, HYBRID, MODEL
from .plans import PlanCache
from .probing import Probes


class Learner:
    """Turns each Outcome into updates of the request's parts and the engine's state."""

    def __init__(self, ctx: Context, probes: Probes, cache: PlanCache):
        self.ctl, self.setup, self.progress, self.est, self.lags = ctx.ctl, ctx.setup, ctx.progress, ctx.est, ctx.lags
        self.probes, self.cache = probes, cache

    def observe(self, o: Outcome, offers: dict, at: int, head: tuple | None) -> None:
        """The step's outcome; `offers`, `at` (tokens made before it) and `head` (a hybrid's lookup,
        match bucket and m) as they were when it was chosen."""
        ctl, est, lags, progress = self.ctl, self.est, self.lags, self.progress
        k, n, acc = o.choice.k, o.n_drafted, o.n_accepted
        used = o.choice.drafter if k > 0 else None
        if o.shadow:
            self.shadow(o.shadow, used, head, offers, at)
        progress.covered += self.lookup_kept(o, used, head)
        if o.target_top:
            est.see_target(o.target_top[: acc + 1])
            if MODEL in self.cache.plans:
                self.cache.forget(MODEL)  # its expected acceptance moved
        progress.advance(acc + 1, o.t_draft + o.t_verify, drafted=bool(n), copied=used in FREE and acc > 0)
        ctl.passed(n, o.t_draft, o.t_verify, acc + 1)
        if used == HYBRID:
            self._hybrid(o, head)
            return
        opening = used and used not in FREE and not at
        f = o.forced  # the grammar's forced run led the draft: the drafter is judged on its own tokens
        if f:
            k, n, acc = k - f, n - f if acc >= f else 0, max(acc - f, 0)
        probing = self.probes.probing
        if used:
            ctl.learn_pooled(used, OPENING if opening else 0, self.setup.kind, acc, min(n, acc + 1),
                             n, min(k, n + 1))
            lags.learn_cost(used, n, f, o.t_draft)
            if n or not (probing and not probing[1]):  # (a probe that found nothing displaced nothing)
                self.probes.drafted(used)
        lags.fell_behind([x for x in self.setup.names if x != used], o.n_accepted + 1)
        if not used:
            return
        est.dlv[used].add(min(k, n + 1), n)
        if n:
            if used in FREE:  # (a lookup's shape is learnt by match bucket, below)
                est.acc[used].add(min(n, acc + 1), acc)
            else:
                est.learn(used, OPENING if opening else 0, est.opening[used] if opening else est.acc[used],
                          min(n, acc + 1), acc)
            order = offers.get(used, (0, 0))[0]
            if order:
                est.learn_lookup(used, bucket(used, order, at), min(n, acc + 1), acc)
            if used == MODEL and o.confidence:
                ctl.priors.confidence_map(MODEL, self.setup.regime).add(o.confidence[f:], acc)
            if used == MODEL and o.target_top and not opening:  # (an opening is judged apart, OPENING)
                ctl.priors.target_map(MODEL, self.setup.regime).add(o.target_top[f:f + n], acc)
        lags.ran(used, bool(o.n_drafted and o.n_accepted == o.n_drafted))
        self.cache.forget(used)
        self.probes.judged(used, n, acc)

    def _hybrid(self, o: Outcome, head: tuple) -> None:
        """A hybrid step teaches the lookup about its m tokens and the draft model about the rest."""
        ctl, est, regime = self.ctl, self.est, self.setup.regime
        k, n, acc, f = o.choice.k, o.n_drafted, o.n_accepted, o.forced
        if f:  # after a grammar's forced run, as in observe
            k, n, acc = k - f, n - f if acc >= f else 0, max(acc - f, 0)
        lookup, bucket_, m = head
        m = min(m, n)
        j, nm, acc_m = k - m, n - m, max(acc - m, 0)  # the draft model's: asked, drafted, accepted
        est.learn_lookup(lookup, bucket_, min(m, acc + 1), min(acc, m))
        est.acc[lookup].add(min(m, acc + 1), min(acc, m))
        self.probes.used_step[lookup] = self.progress.step
        self.cache.forget(lookup)
        self.lags.fell_behind([x for x in self.setup.names if x != MODEL or j <= 0], o.n_accepted + 1)
        if j <= 0:  # the engine cut k to the lookup's tokens (max_tokens, the context): no model ran
            return
        est.dlv[MODEL].add(min(j, nm + 1), nm)
        if nm and acc >= m:  # the model's tokens were judged only if the lookup's all were kept
            est.learn(MODEL, 0, est.acc[MODEL], min(nm, acc_m + 1), acc_m)
            ctl.learn_pooled(MODEL, 0, self.setup.kind, acc_m, min(nm, acc_m + 1))
            if o.confidence:
                ctl.priors.confidence_map(MODEL, regime).add(o.confidence[f + m:], acc_m)
            if o.target_top:
                ctl.priors.target_map(MODEL, regime).add(o.target_top[f + m:f + n], acc_m)
        self.lags.learn_cost(MODEL, nm, f + m, o.t_draft)
        self.probes.drafted(MODEL)
        self.lags.ran(MODEL, bool(nm and acc == n))  # as after its own draft
        self.probes.cost.pop(MODEL, None)
        self.probes.used_step[MODEL] = self.progress.step
        self.cache.forget(MODEL)

    def shadow(self, shadow, used: str | None, head: tuple | None, offers: dict, at: int) -> None:
        """What the lookups that did not draft would have (estimates.Estimates.learn_shadow)."""
        skip = (used, head[0] if used == HYBRID and head else None)
        for name in self.est.learn_shadow(shadow, skip, offers, at):
            self.cache.forget(name)

    @staticmethod
    def lookup_kept(o: Outcome, used: str | None, head: tuple | None) -> int:
        """Of the step's tokens, those a lookup drafted and kept, or would have (its shadow)."""
        kept = 0
        if used in FREE:
            kept = o.n_accepted
        elif used == HYBRID and head:
            kept = min(o.n_accepted, head[2])
        for name, (_, hit) in (o.shadow or {}).items():
            if name in FREE:
                kept = max(kept, min(hit, o.n_accepted + 1))
        return kept
