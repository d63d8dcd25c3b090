"""Whether a draft model takes the prompt before the first step, and what catching up costs.

A draft model takes the prompt before the first step (`prefill`) only if it is expected to
save more over the request than the prompt costs it (its measured seconds per prompt token x
the tokens its cache lacks): on a CPU a Q4_1 draft processes a long prompt at half the F16
target's speed, which a short answer never wins back. It saves only on the tokens the lookups
do not copy for free (a summary's, a code edit's): that catch-up, up front or at its first
step, is weighed over the share of the request's tokens the lookups are not expected to cover
(_uncovered), learnt per request from what they kept or would have kept, from the engine's
share at the regime. The same request again leaves nothing to it: the suffix drafter copies the
earlier answer (taking a 400-token prompt would cost the reference pair's 0.5B about as long as the
two 64-token passes that copy a 128-token answer).
"""
from __future__ import annotations

import math

from ..drafters.suffix import SuffixDrafter
from . import planner
from .acceptance import PRIOR_W, REPEAT
from .names import FREE

_TRIAL_STEPS = 3  # steps a request drafts before its own acceptance overrules a prior that was too hopeful
_SHARE_W = 16.0  # tokens of the engine's lookup share a request's own count of what lookups covered starts from
_UNCOVERED_MIN = 0.1  # the least share of a request's tokens a draft model's prompt catch-up is spread over


class Prefill:
    """AutoPolicy's prefill judgement and catch-up costs (request.py holds the state they read)."""

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
        if self._repeating():  # the same request again: its earlier answer is copied, not drafted
            return _UNCOVERED_MIN
        prior = self.ctl.share_of_lookups(self.regime)
        share = (self.covered + _SHARE_W * prior) / (self.generated + _SHARE_W)
        return max(1.0 - share, _UNCOVERED_MIN)

    def _repeating(self) -> bool:
        """Whether the suffix drafter's match is the same request again (acceptance.REPEAT)."""
        order = self.offers.get(SuffixDrafter.name, (0, 0))[0]
        return self._bucket(SuffixDrafter.name, order, self.generated) == REPEAT

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
        if self._repeating():  # the same request again: copied; a catch-up, if ever needed, comes then
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
        w = sp.weight(m) if sp is not None else PRIOR_W
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
