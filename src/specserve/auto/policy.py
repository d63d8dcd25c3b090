"""One request's `--spec auto` policy: the per-request bookkeeping and probing around the planner.

Each step it turns what it knows into planner options (planner.py) and takes the plan
with the most expected tokens per second; then it learns from the step's outcome:

- acceptance per draft position, per drafter, and for a lookup per match bucket (a 4-token
  match predicts a copy far better than a 1-token one), decayed and shrunk toward the
  engine's pooled rates (controller.py), which are the prior of the next request, each
  position as the engine has seen acceptance move with the position (acceptance.Shape);
- delivery: how often a drafter that may stop early (a draft model) returns an i-th token;
- the draft model's confidence map (its top probability at a drafted token -> acceptance),
  which each step hands to the draft model as a planner.ConfidenceStop;
- the target's map (its top probability where a draft token was judged -> that token's
  acceptance) and how sure the target has been of this request's last ~10 tokens: together,
  what the draft model is expected to keep here, the level its rates lean on (_model_level),
  known at sampled steps before the draft model has paid a catch-up to find out;
- lags: how far each drafter's cache is behind, and whether it holds this request's prompt.

The engine tells it, each step, what each lookup drafter would match (`see`), so a lookup
is planned only when it has a match, up to what it has; and after the step, how each lookup
that matched but did not draft would have fared against the committed tokens
(`Outcome.shadow`), so a lookup's acceptance is learnt at every step for free: a request
where lookups fail (a translation) learns it without paying a pass per failed lookup. A
match at the request's first step ends in the prompt's template and is learnt apart
(OPENING), and so is the draft model's first draft (this pair opens an answer "Here is"
where its draft says "To": 16 of 18 first drafts kept nothing). With a draft model and a
lookup, the hybrid (drafters.hybrid) is planned too: the lookup's m tokens, then the draft
model from where they end; it is planned only when a lookup matches fewer tokens than its cap.
Switching on a lagging drafter charges its catch-up over the tokens the request is still
expected to make.

A draft model takes the prompt before the first step (`prefill`) only if it is expected
to save more over the request than the prompt costs it (its measured seconds per prompt
token x the tokens its cache lacks): on a CPU a Q4_1 draft processes a long prompt at
half the F16 target's speed, which a short answer never wins back. It saves only on the
tokens the lookups do not copy for free (a summary's, a code edit's): that catch-up, up
front or at its first step, is weighed over the share of the request's tokens the lookups
are not expected to cover (_uncovered), learnt per request from what they kept or would
have kept, from the engine's share at the regime.

A drafter not in use (a draft model; a lookup only until the engine has judged it unasked)
is probed with a short draft once the steps since its last use
reach an interval (doubled after a failure, up to 32) and the probe's expected loss,
catch-up included, fits in _EPS of the decode time since the drafter last ran (in this
request, plus what the engine saved before it). A drafter never run in this process is
probed at once if nothing is known of it; if a loaded profile measured it, its budget
counts from the process's start. A fully accepted probe is followed up at once, a few
times; one whose catch-up cost is still unknown, while its lag is short; one that could
not pay even at 100% acceptance, at 1/8 of the budget. The hybrid is never probed: its
parts are.

Threads: a policy is used by one thread; every method that touches the shared Controller
holds its lock for the whole call (see controller.py).
"""
from __future__ import annotations

import logging
import math

from ..config import SpecParams
from ..drafters.hybrid import LOOKUPS
from ..policy import OFF, Choice, Outcome
from . import planner
from .acceptance import _PRIOR_W, OPENING, ConfidenceMap, Rates, Shape, match_bucket
from .controller import FREE, Controller
from .cost import DraftCost

_G_ENGINE = 0.98  # per-step decay of the engine's pooled counts
_EPS = 0.01  # share of decode time that probes may lose
_PROBE_MIN, _PROBE_MAX = 4, 32  # steps between probes of an unused drafter
_FOLLOW_UPS = 6  # successful probes in a row that may bypass the budget
_TRIAL_STEPS = 3  # steps a request drafts before its own acceptance overrules a prior that was too hopeful
_G_SEEN = 0.9  # per-token decay of a request's record of the target's top probability: its last ~10 tokens
_SEEN_MIN = 2.0  # (decayed) tokens of that record before it predicts the draft model's acceptance
_SHARE_W = 16.0  # tokens of the engine's lookup share a request's own count of what lookups covered starts from
_UNCOVERED_MIN = 0.1  # the least share of a request's tokens a draft model's prompt catch-up is spread over
LOOKUP_MAX = 64  # how far a lookup drafter may draft under auto where the user set no cap
MODEL = "draft"  # the draft model's drafter name
HYBRID = "hybrid"  # a lookup's match, then the draft model (drafters.hybrid)
HYBRID_LOOKUPS = LOOKUPS  # the lookups the hybrid follows, in the order it tries them

trace = logging.getLogger("specserve.auto")  # one DEBUG line a step: SPECSERVE_LOG=debug


class AutoPolicy:
    """One request's adaptive policy; see the module docstring."""

    # the engine tells it, each step, what each lookup drafter would match: see(name, offer)
    # (see_ngram(order, available) where the engine speaks only of the n-gram)
    sees_offers = True
    sees_ngram = True

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
        self._step_opening = True
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
    def _bucket(order: int, opening: bool) -> int:
        """The acceptance bucket of a lookup's match: by its length, or OPENING at a request's first step."""
        return OPENING if opening else match_bucket(order)

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

    def _see_target(self, top) -> None:
        """The target's top probability at the step's tokens (Outcome.target_top)."""
        seen = self._seen_top
        for p in top:
            for b in range(len(seen)):
                seen[b] *= _G_SEEN
            seen[ConfidenceMap.bucket(p)] += 1.0
        if MODEL in self._plans:
            self._forget_plans(MODEL)  # its expected acceptance moved

    def _learn_rates(self, name: str, bucket: int, rates: Rates, tried: int, hit: int) -> None:
        """A judged draft: the request's rates, and its counts for the engine's Shape (at finish)."""
        rates.add(tried, hit)
        Shape.judge(self._judged.setdefault((name, bucket), [[0.0] * Shape.GROUPS, [0.0] * Shape.GROUPS]),
                    tried, hit)

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
            order = self._bucket(order, self.generated == 0)
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
                bucket = self._bucket(order, self.generated == 0)
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

    def _catchup(self, name: str, V, uncovered: float = 1.0) -> float:
        """Seconds the drafter will spend catching up beyond an in-step draft's; its prompt's
        share over `uncovered` (to be spread over the request's tokens, it is repaid by that share)."""
        if name in FREE:
            return 0.0  # indexing the tokens it missed: microseconds a token
        start = self.ctl.prompt_cost.get(name, 0.0) * self.missing[name] if name in self.fresh else 0.0
        return start / uncovered + self.ctl.draft_coef(name, V)[2] * max(self.lag[name] - 2, 0)

    def _horizon(self) -> float:
        """Tokens this request is still expected to make: the others' mean length, within its own cap."""
        ctl = self.ctl
        mean = max((ctl.tokens - self.generated) / (ctl.requests - 1) - self.generated, 32.0)
        return max(min(mean, self.max_tokens - self.generated), 1.0)

    def _prefill_horizon(self) -> float:
        """Tokens a prefill is judged over: what the shorter quarter of recent requests still made
        past this point (the others' mean where fewer than 4 are known). The prompt's catch-up is
        paid in full by a request that may end at once: a short answer (a translation, 12-37
        tokens) paid it out of a mean horizon that the 64-token answers around it made."""
        left = sorted(n - self.generated for n in self.ctl.lengths if n > self.generated)
        if len(left) < 4:
            return self._horizon()
        return max(min(left[(len(left) - 1) // 4], self.max_tokens - self.generated), 1.0)

    def _uncovered(self) -> float:
        """The share of this request's tokens that its lookups are not expected to cover: where a
        draft model can save anything. What they covered so far (drafted and kept, or would have:
        Outcome.shadow), from the share they covered in recent requests at this regime.

        A draft model's prompt catch-up is paid once and repaid only by the tokens it drafts.
        Judged over every token to come, as if each would otherwise cost a plain pass, a long
        prompt's catch-up looked repaid on a summary at 0.8, where the n-gram and suffix
        lookups copy much of the answer for free: the 0.5B took a 709-token prompt in 8.3 s
        and the request ran at 0.90x the target alone (1.4x without that prefill)."""
        if not self.has_lookups:
            return 1.0
        prior = self.ctl.share_of_lookups(self.regime)
        share = (self.covered + _SHARE_W * prior) / (self.generated + _SHARE_W)
        return max(1.0 - share, _UNCOVERED_MIN)

    def _lookup_kept(self, o: Outcome, used: str | None) -> int:
        """Of the step's tokens, those a lookup drafted and kept, or would have (its shadow)."""
        kept = 0
        if used in FREE:
            kept = o.n_accepted
        elif used == HYBRID and self._step_head:
            kept = min(o.n_accepted, self._step_head[2])
        for name, (_, hit) in (o.shadow or {}).items():
            if name in FREE:
                kept = max(kept, min(hit, o.n_accepted + 1))
        return kept

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

    # --- probing ------------------------------------------------------------------------------

    def _probe(self, name: str, V, best_rate: float) -> planner.Plan | None:
        """The plan of a short probe of `name`, if one is due now."""
        ctl = self.ctl
        if name in self.offers and not self.offers[name][0]:
            return None  # nothing to probe with
        if name in ctl.shadowed:
            return None  # judged at every step where it matches, unasked: nothing a probe would add
        if self.step - self.used_step[name] < ctl.interval.get(name, _PROBE_MIN):
            return None
        budget = _EPS * (self.clock - self.since[name])
        k, fit = self.kmin[name], ctl.draft.get(name)
        # what catching up costs is unknown until lags vary: look while the lag is short and cheap
        # (never while its cache lacks this request's prompt: that catch-up is what makes a probe costly)
        early = (name not in FREE and name not in self.fresh and fit is not None and not fit.lag_known()
                 and self.lag[name] <= 2 * _PROBE_MIN)
        if not (early or self.follow_up and self.follow_up[0] == name):
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
        return self._plan(name, V, kmin=k, kmax=k)

    def _could_pay(self, name: str, V) -> bool:
        """Whether the drafter would pay if every token it drafted were accepted."""
        return self._plan(name, V, kmin=self.kmin[name], found=True, ceiling=True).rate > 1.0 / V[1]

    # --- the engine's calls -------------------------------------------------------------------

    def prefill(self, name: str, n_missing: int, max_tokens: int) -> bool:
        """Whether a model drafter should take the prompt before the first step.

        Catching up on the prompt costs the same whenever it happens (one batch); doing it
        up front only pays if the drafter is then expected to save more than that over the
        request: (plain seconds per token - its seconds per token) x the tokens to come that
        the lookups are not expected to cover (_uncovered), over what this request's
        acceptance may be (_prefill_gain), > its measured seconds per prompt token x n_missing.
        Until that cost has been measured once (at a first use, which the plans charge),
        nothing is prefilled.
        """
        self.max_tokens = max_tokens
        if name not in self.names or name in FREE or max_tokens < 2:  # one token: nothing to draft
            return False
        with self.ctl.lock:
            self.missing[name] = n_missing
            if n_missing > 0:  # (none: its cache holds the prompt already, nothing to pay)
                per_token = self.ctl.prompt_cost.get(name)
                V = self.ctl.verify.table(self.cap + 1)
                if per_token is None or V is None:
                    return False
                tokens = min(self._prefill_horizon(), max_tokens - 1) * self._uncovered()
                if self._prefill_gain(name, V, tokens) <= per_token * n_missing:
                    return False
        self.fresh.discard(name)
        self.lag[name] = 1  # the prompt's last token, which every step feeds
        return True

    def _prefill_gain(self, name: str, V, tokens: float) -> float:
        """Seconds a draft model that takes the prompt now is expected to save over `tokens`.

        Requests differ (a code answer keeps 0.9 of the 0.5B's tokens, prose half as many), and
        which kind this one is shows only once the drafter runs. Judged at the pooled rate
        alone, a catch-up that a code request repays several times is declined wherever the
        pooled rate sits near break-even, and the drafter, never run, never shows otherwise.
        So the gain is averaged over the pooled rate and one spread of requests (Spread) either
        side of it; where a level does not pay, the request loses the few steps that teach it
        so (_TRIAL_STEPS), not the request.

        The pooled rate is itself an estimate, from the (decayed) trials q[1] behind it: its own
        variance, m (1 - m) / (q[1] + 1), adds to the spread of requests. Without it, a regime
        left thin by reloads (2 trials) and one failed draft there (0.35 at T0.8) was judged as
        surely as 40 alike requests, declined every prefill, and so never drafted to learn better.
        """
        ctl = self.ctl
        q = ctl.prior(name, 0, self.regime)
        m = q[0] / q[1]
        sp = ctl.spread.get((name, 0, self.regime))
        w = sp.weight(m) if sp is not None else _PRIOR_W
        sd = math.sqrt(m * (1.0 - m) * (1.0 / (w + 1.0) + 1.0 / (q[1] + 1.0)))
        cost, dlv, cap = tuple(ctl.draft_coef(name, V)), self.dlv[name].rates(q[2] / q[3]), self.caps[name]
        total = 0.0
        for x in (m - sd, m, m + sd):
            acc = [min(max(x, 0.0), 0.99)] * cap
            p = planner.best_length(planner.Option(name, acc, cost, cap, self.kmin[name], dlv), V)
            if p.k and p.rate * V[1] > 1.0:
                total += tokens * (V[1] - 1.0 / p.rate)
            elif p.k:
                total -= _TRIAL_STEPS * (p.seconds - p.tokens * V[1])
        return total / 3.0

    def prefilled(self, name: str, n_tokens: int, seconds: float) -> None:
        """Told what a prefill cost: the prompt's catch-up rate, for the next decisions."""
        if n_tokens > 0:
            with self.ctl.lock:
                self.ctl.learn_prompt_cost(name, seconds / n_tokens)

    def finish(self) -> None:
        """The request ended: tell the engine how far its rates were from the pooled ones (Spread),
        and how its drafts held by position against its own rate (Shape)."""
        with self.ctl.lock:
            rates = [(name, 0, r) for name, r in self.acc.items()]
            rates += [(name, bucket, r) for (name, bucket), r in self.acc_order.items()]
            for name, bucket, r in rates:
                if r.rate is not None:
                    self.ctl.learn_spread(name, bucket, self.regime, r.rate, r.t)
            for (name, bucket), counts in self._judged.items():
                self.ctl.position_shape(name, bucket, self.regime).add(counts)
            self.ctl.learn_length(self.generated)
            if self.has_lookups:
                self.ctl.learn_lookup_share(self.regime, self.covered, self.generated)

    def see(self, name: str, offer: tuple[int, int]) -> None:
        """What a lookup drafter would draft this step: its match length (0: none), tokens available."""
        if name in self.caps:
            self.offers[name] = (int(offer[0]), int(offer[1]))  # plans are cached by match and length

    def see_ngram(self, order: int, available: int) -> None:
        self.see("ngram", (order, available))

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
        self._step_opening = self.generated == 0  # the request's first step: its lookups match the prompt's end
        self._step_head = self._hybrid_head() if self.hybrid else None
        V = self.ctl.verify.table(self.cap + 1)  # [cap + 2] seconds per pass over n tokens
        if V is None:
            return OFF  # the first step of a fresh engine measures a plain pass
        name, plan, rate = self._best(V)
        pending, self.pending = self.pending, None
        for other in self.names:
            if other == name:
                continue
            probe = pending[1] if pending and pending[0] == other and not plan.k else self._probe(other, V, rate)
            if probe:
                self.probing = (other, plan.k > 0, probe)
                name, plan = other, probe
                break
        self.pred_tokens += plan.tokens
        self.pred_time += plan.seconds
        self._step_plan = (name, plan)
        if not plan.k:
            return OFF
        return Choice(name, plan.k, self._stop_rule(name, plan, V))

    def observe(self, o: Outcome) -> None:
        with self.ctl.lock:
            self._observe(o)

    def _observe(self, o: Outcome) -> None:
        if trace.isEnabledFor(logging.DEBUG):
            self._trace(o)
        ctl, k, n, acc = self.ctl, o.choice.k, o.n_drafted, o.n_accepted
        used = o.choice.drafter if k > 0 else None
        if o.shadow:
            self._observe_shadow(o.shadow, used)
        self.covered += self._lookup_kept(o, used)
        if o.target_top:
            self._see_target(o.target_top[: acc + 1])
        self.generated += acc + 1
        self.clock += o.t_draft + o.t_verify
        ctl.clock += o.t_draft + o.t_verify
        ctl.tokens += acc + 1
        ctl.verify.add(1 + n, o.t_verify)
        if used == HYBRID:
            self._observe_hybrid(o)
            return
        opening = used and used not in FREE and self._step_opening
        if used:
            p, g = ctl.prior(used, OPENING if opening else 0, self.regime), _G_ENGINE
            p[0], p[1] = p[0] * g + acc, p[1] * g + min(n, acc + 1)
            p[2], p[3] = p[2] * g + n, p[3] * g + min(k, n + 1)
            self._learn_draft_cost(used, n, 0, o.t_draft)
            if n or not (self.probing and not self.probing[1]):
                ctl.last_used[used], self.since[used] = ctl.clock, self.clock
        for other in self.names:
            if other != used:
                self.lag[other] += acc + 1
        if not used:
            return
        self.dlv[used].add(min(k, n + 1), n)
        if n:
            if used in FREE:  # (a lookup's shape is learnt by match bucket, below)
                self.acc[used].add(min(n, acc + 1), acc)
            else:
                self._learn_rates(used, OPENING if opening else 0, self._opening[used] if opening else self.acc[used],
                                  min(n, acc + 1), acc)
            order = self._step_offers.get(used, (0, 0))[0]
            if order:
                self._learn_lookup(used, self._bucket(order, self._step_opening), min(n, acc + 1), acc)
            if used == MODEL and o.confidence:
                ctl.confidence_map(MODEL, self.regime).add(o.confidence, acc)
            if used == MODEL and o.target_top and not opening:  # (an opening is judged apart, OPENING)
                ctl.target_map(MODEL, self.regime).add(o.target_top[:n], acc)
        self.lag[used] = 2 if n and acc == n else 1  # it holds all but the bonus (and last draft)
        self._probe_cost.pop(used, None)
        self._forget_plans(used)
        self.fresh.discard(used)
        if self.probing is None:
            self.used_step[used] = self.step
            return
        probed, displaced, plan = self.probing
        if not n and not displaced:
            self.pending = (probed, plan)  # no match: nothing lost, ask again next step
            return
        self.used_step[used] = self.step
        if n:
            V, iv = ctl.verify.table(self.cap + 1), ctl.interval.get(probed, _PROBE_MIN)
            done = self.follow_up[1] if self.follow_up and self.follow_up[0] == probed else 0
            # all accepted: followed up at once, outside the budget, a few times at most
            good = acc == n and done < _FOLLOW_UPS and self._could_pay(probed, V)
            ok = good or self._best(V)[0] == probed
            ctl.interval[probed] = 1 if ok else min(max(2 * iv, _PROBE_MIN), _PROBE_MAX)
            self.follow_up = (probed, done + 1) if good else None

    def _trace(self, o: Outcome) -> None:
        """The step as planned and as it went, for SPECSERVE_LOG=debug."""
        name, plan = self._step_plan
        planned = (f"{name or 'plain'} k={plan.k} rate {plan.rate:.2f} tok/s ({plan.tokens:.2f} tokens in {plan.seconds:.3f} s)"
                   if plan else "plain (measuring)")
        lookup = self._step_head[0] if name == HYBRID and self._step_head else name
        if lookup in self._step_offers:  # what the lookup matched: its length, and the tokens it had
            planned += " (match %d, %d available)" % self._step_offers[lookup]
        probe = f" probe of {self.probing[0]}" if self.probing else ""
        rates = " ".join(f"{d}:{r.rate:.2f}" for d, r in self.acc.items() if r.rate is not None)
        trace.debug("step %d T%s: planned %s%s; ran %s k=%d drafted %d accepted %d; draft %.3f s verify %.3f s; "
                    "lags %s; acceptance so far %s", self.step, self.regime, planned, probe,
                    o.choice.drafter if o.choice.k else "plain", o.choice.k, o.n_drafted, o.n_accepted,
                    o.t_draft, o.t_verify, dict(self.lag), rates or "-")

    def _observe_hybrid(self, o: Outcome) -> None:
        """A hybrid step teaches the lookup about its m tokens and the draft model about the rest."""
        ctl, k, n, acc = self.ctl, o.choice.k, o.n_drafted, o.n_accepted
        lookup, bucket, m = self._step_head
        m = min(m, n)
        j, nm, acc_m = k - m, n - m, max(acc - m, 0)  # the draft model's: asked, drafted, accepted
        self._learn_lookup(lookup, bucket, min(m, acc + 1), min(acc, m))
        self.acc[lookup].add(min(m, acc + 1), min(acc, m))
        self.used_step[lookup] = self.step
        self._forget_plans(lookup)
        for other in self.names:
            if other != MODEL or j <= 0:
                self.lag[other] += acc + 1
        if j <= 0:  # the engine cut k to the lookup's tokens (max_tokens, the context): no model ran
            return
        self.dlv[MODEL].add(min(j, nm + 1), nm)
        if nm and acc >= m:  # the model's tokens were judged only if the lookup's all were kept
            self._learn_rates(MODEL, 0, self.acc[MODEL], min(nm, acc_m + 1), acc_m)
            p, g = ctl.prior(MODEL, 0, self.regime), _G_ENGINE
            p[0], p[1] = p[0] * g + acc_m, p[1] * g + min(nm, acc_m + 1)
            if o.confidence:
                ctl.confidence_map(MODEL, self.regime).add(o.confidence[m:], acc_m)
            if o.target_top:
                ctl.target_map(MODEL, self.regime).add(o.target_top[m:n], acc_m)
        self._learn_draft_cost(MODEL, nm, m, o.t_draft)
        ctl.last_used[MODEL], self.since[MODEL] = ctl.clock, self.clock
        self.lag[MODEL] = 2 if nm and acc == n else 1  # as after its own draft
        self.fresh.discard(MODEL)
        self._probe_cost.pop(MODEL, None)
        self.used_step[MODEL] = self.step
        self._forget_plans(MODEL)

    def _observe_shadow(self, shadow, used: str | None) -> None:
        """What the lookups that did not draft would have: their acceptance at every step, unasked.

        A lookup is judged against the committed tokens at each step where it matched
        (engine: Outcome.shadow), so this request learns how its lookups fare without paying a
        pass for a failed one, and never needs to probe them."""
        head = self._step_head[0] if used == HYBRID and self._step_head else None
        for name, (tried, hit) in shadow.items():
            order = self._step_offers.get(name, (0, 0))[0]
            # the engine judges a lookup's proposal against every committed token, which after a long
            # draft (8 kept + the bonus) runs past a lookup capped at --draft-max: it would draft its cap
            tried = min(tried, self.caps.get(name, 0))
            hit = min(hit, tried)
            if name in FREE and name in self.caps and name not in (used, head) and order and tried:
                self._learn_lookup(name, self._bucket(order, self._step_opening), tried, hit)
                self.acc[name].add(tried, hit)
                self.ctl.shadowed.add(name)
                self._forget_plans(name)

    def _learn_lookup(self, name: str, bucket: int, tried: int, hit: int) -> None:
        """A lookup's tokens after a match in `bucket`: this request's rates and the engine's prior."""
        if not tried:
            return
        self._learn_rates(name, bucket, self.acc_order.setdefault((name, bucket), Rates(self.caps[name])), tried, hit)
        q = self.ctl.prior(name, bucket, self.regime)
        q[0], q[1] = q[0] * _G_ENGINE + hit, q[1] * _G_ENGINE + tried

    def _learn_draft_cost(self, name: str, n: int, extra: int, t_draft: float) -> None:
        """Seconds a drafter took for n tokens, its cache `extra` tokens further behind than its lag."""
        ctl = self.ctl
        if name in self.fresh:  # the prompt's catch-up: what the regression does not explain
            if self.missing[name] > 0 and name not in FREE:
                a, b, c = ctl.draft_coef(name, ctl.verify.table(self.cap + 1))
                over = max(t_draft - a - b * n - c * (self.lag[name] + extra), 0.0)
                ctl.learn_prompt_cost(name, over / self.missing[name])
        else:
            fit = ctl.draft.get(name) or ctl.draft.setdefault(name, DraftCost())
            fit.add(n, self.lag[name] + extra, t_draft)

    def _forget_plans(self, *names: str) -> None:
        """Their estimates changed: their cached plans, and the hybrid's, are stale."""
        for name in names:
            self._plans[name].clear()
        self._plans[HYBRID].clear()
