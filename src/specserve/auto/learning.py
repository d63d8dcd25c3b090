"""What one request learns from each step's outcome, for itself and for the engine's pooled state.

- acceptance per draft position, per drafter, and for a lookup per match bucket (a 4-token
  match predicts a copy far better than a 1-token one), decayed and shrunk toward the
  engine's pooled rates (controller.py), which are the prior of the next request, each
  position as the engine has seen acceptance move with the position (acceptance.Shape);
- delivery: how often a drafter that may stop early (a draft model) returns an i-th token;
- the draft model's confidence map (its top probability at a drafted token -> acceptance),
  which each step hands to the draft model as a planner.ConfidenceStop;
- the target's map (its top probability where a draft token was judged -> that token's
  acceptance) and how sure the target has been of this request's last ~10 tokens: together,
  what the draft model is expected to keep here (request.py: _model_level), known at sampled
  steps before the draft model has paid a catch-up to find out;
- lags: how far each drafter's cache is behind, and whether it holds this request's prompt.

After the step, the engine tells it how each lookup that matched but did not draft would have
fared against the committed tokens (`Outcome.shadow`), so a lookup's acceptance is learnt at
every step for free: a request where lookups fail (a translation) learns it without paying a
pass per failed lookup. A match at the request's first step ends in the prompt's template and
is learnt apart (OPENING), and so is the draft model's first draft (this pair opens an answer
"Here is" where its draft says "To": 16 of 18 first drafts kept nothing).
"""
from __future__ import annotations

from ..policy import Outcome
from .acceptance import OPENING, ConfidenceMap, Rates, Shape
from .cost import DraftCost
from .names import FREE, HYBRID, MODEL
from .probing import FOLLOW_UPS, PROBE_MAX, PROBE_MIN

_G_ENGINE = 0.98  # per-step decay of the engine's pooled counts
_G_SEEN = 0.9  # per-token decay of a request's record of the target's top probability: its last ~10 tokens


class Learning:
    """AutoPolicy's learning from outcomes (request.py holds the state it updates)."""

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

    def observe(self, o: Outcome) -> None:
        with self.ctl.lock:
            self._observe(o)

    def _observe(self, o: Outcome) -> None:
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
        opening = used and used not in FREE and not self._step_at
        # a grammar's forced run led the draft (drafters.forced): the drafter is judged on its own
        # tokens after it (none where a forced token was rejected), as the hybrid's model is
        f = o.forced
        if f:
            k, n, acc = k - f, n - f if acc >= f else 0, max(acc - f, 0)
        if used:
            p, g = ctl.prior(used, OPENING if opening else 0, self.regime), _G_ENGINE
            p[0], p[1] = p[0] * g + acc, p[1] * g + min(n, acc + 1)
            p[2], p[3] = p[2] * g + n, p[3] * g + min(k, n + 1)
            self._learn_draft_cost(used, n, f, o.t_draft)
            if n or not (self.probing and not self.probing[1]):
                ctl.last_used[used], self.since[used] = ctl.clock, self.clock
        for other in self.names:
            if other != used:
                self.lag[other] += o.n_accepted + 1
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
                self._learn_lookup(used, self._bucket(used, order, self._step_at), min(n, acc + 1), acc)
            if used == MODEL and o.confidence:
                ctl.confidence_map(MODEL, self.regime).add(o.confidence[f:], acc)
            if used == MODEL and o.target_top and not opening:  # (an opening is judged apart, OPENING)
                ctl.target_map(MODEL, self.regime).add(o.target_top[f:f + n], acc)
        self.lag[used] = 2 if o.n_drafted and o.n_accepted == o.n_drafted else 1  # it holds all but the bonus (and last draft)
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
            V, iv = ctl.verify.table(self.cap + 1), ctl.interval.get(probed, PROBE_MIN)
            done = self.follow_up[1] if self.follow_up and self.follow_up[0] == probed else 0
            # all accepted: followed up at once, outside the budget, a few times at most
            good = acc == n and done < FOLLOW_UPS and self._could_pay(probed, V)
            ok = good or self._best(V)[0] == probed
            ctl.interval[probed] = 1 if ok else min(max(2 * iv, PROBE_MIN), PROBE_MAX)
            self.follow_up = (probed, done + 1) if good else None

    def _observe_hybrid(self, o: Outcome) -> None:
        """A hybrid step teaches the lookup about its m tokens and the draft model about the rest."""
        ctl, k, n, acc, f = self.ctl, o.choice.k, o.n_drafted, o.n_accepted, o.forced
        if f:  # after a grammar's forced run, as in _observe
            k, n, acc = k - f, n - f if acc >= f else 0, max(acc - f, 0)
        lookup, bucket, m = self._step_head
        m = min(m, n)
        j, nm, acc_m = k - m, n - m, max(acc - m, 0)  # the draft model's: asked, drafted, accepted
        self._learn_lookup(lookup, bucket, min(m, acc + 1), min(acc, m))
        self.acc[lookup].add(min(m, acc + 1), min(acc, m))
        self.used_step[lookup] = self.step
        self._forget_plans(lookup)
        for other in self.names:
            if other != MODEL or j <= 0:
                self.lag[other] += o.n_accepted + 1
        if j <= 0:  # the engine cut k to the lookup's tokens (max_tokens, the context): no model ran
            return
        self.dlv[MODEL].add(min(j, nm + 1), nm)
        if nm and acc >= m:  # the model's tokens were judged only if the lookup's all were kept
            self._learn_rates(MODEL, 0, self.acc[MODEL], min(nm, acc_m + 1), acc_m)
            p, g = ctl.prior(MODEL, 0, self.regime), _G_ENGINE
            p[0], p[1] = p[0] * g + acc_m, p[1] * g + min(nm, acc_m + 1)
            if o.confidence:
                ctl.confidence_map(MODEL, self.regime).add(o.confidence[f + m:], acc_m)
            if o.target_top:
                ctl.target_map(MODEL, self.regime).add(o.target_top[f + m:f + n], acc_m)
        self._learn_draft_cost(MODEL, nm, f + m, o.t_draft)
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
                self._learn_lookup(name, self._bucket(name, order, self._step_at), tried, hit)
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
