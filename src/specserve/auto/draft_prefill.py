"""Whether a draft model takes the prompt before the first step, and what catching up costs.

A draft model takes the prompt before the first step (`prefill`) only if it is expected to
save more over the request than the prompt costs it (its measured seconds per prompt token x
the tokens its cache lacks): on a CPU a Q4_1 draft processes a long prompt at half the F16
target's speed, which a short answer never wins back. It saves only on the tokens the lookups
do not copy for free (a summary's, a code edit's): that catch-up, up front or at its first
step, is weighed over the share of the request's tokens the lookups are not expected to cover
(Prefill.uncovered), learnt per request from what they kept or would have kept, from the engine's
share for its kind. The same request again leaves nothing to it: the suffix drafter copies the
earlier answer (taking a 400-token prompt would cost the reference pair's 0.5B about as long as the
two 64-token passes that copy a 128-token answer).
"""
from __future__ import annotations

from typing import Callable

from . import hot
from .acceptance import REPEAT
from .context import Context
from .estimates import bucket
from .names import FREE
from .probing import PlanFor
from ..drafters.suffix import SuffixDrafter

_TRIAL_STEPS = 3  # steps a request drafts before its own acceptance overrules a prior that was too hopeful
_SHARE_W = 16.0  # tokens of the engine's lookup share a request's own count of what lookups covered starts from
_UNCOVERED_MIN = 0.1  # the least share of a request's tokens a draft model's prompt catch-up is spread over


class Prefill:
    """One request's judgement of a prompt catch-up: whether a draft model takes the prompt up front, and
    over how many tokens a catch-up is repaid. `gain` (default `spread_gain`) prices taking it now."""

    def __init__(self, ctx: Context, plan_for: PlanFor, gain: "Gain | None" = None):
        """plan_for: the request's best plan of one drafter, for a `gain` that prices by it."""
        self.ctl, self.setup, self.progress, self.est, self.lags = ctx.ctl, ctx.setup, ctx.progress, ctx.est, ctx.lags
        self.plan_for = plan_for
        self.gain = gain or spread_gain

    def horizon(self) -> float:
        """Tokens this request is still expected to make: the others' mean length, within its own cap."""
        ctl, done = self.ctl, self.progress.generated
        mean = max((ctl.history.tokens - done) / (ctl.history.requests - 1) - done, 32.0)
        return max(min(mean, self.progress.max_tokens - done), 1.0)

    def prefill_horizon(self) -> float:
        """Tokens a prefill is judged over: what the shorter quarter of recent requests still made
        past this point (the others' mean where fewer than 4 are known). The prompt's catch-up is
        paid in full by a request that may end at once: a short answer (a translation, 12-37
        tokens) paid it out of a mean horizon that the 64-token answers around it made."""
        done = self.progress.generated
        left = sorted(n - done for n in self.ctl.history.lengths if n > done)
        if len(left) < 4:
            return self.horizon()
        return max(min(left[(len(left) - 1) // 4], self.progress.max_tokens - done), 1.0)

    def uncovered(self) -> float:
        """The share of this request's tokens that its lookups are not expected to cover: where a
        draft model can save anything. What they covered so far (drafted and kept, or would have:
        Outcome.shadow), from the share they covered in recent requests of this kind.

        A draft model's prompt catch-up is paid once and repaid only by the tokens it drafts.
        Judged over every token to come, as if each would otherwise cost a plain pass, a long
        prompt's catch-up looked repaid on a summary at 0.8, where the n-gram and suffix
        lookups copy much of the answer for free: the 0.5B took a 709-token prompt in 8.3 s
        and the request ran at 0.90x the target alone (1.4x without that prefill)."""
        if not self.setup.has_lookups:
            return 1.0
        if self.repeating():  # the same request again: its earlier answer is copied, not drafted
            return _UNCOVERED_MIN
        prior = self.ctl.history.share_of_lookups(self.setup.kind)
        share = (self.progress.covered + _SHARE_W * prior) / (self.progress.generated + _SHARE_W)
        return max(1.0 - share, _UNCOVERED_MIN)

    def repeating(self) -> bool:
        """Whether the suffix drafter's match is the same request again (acceptance.REPEAT)."""
        order = self.progress.offers.get(SuffixDrafter.name, (0, 0))[0]
        return bucket(SuffixDrafter.name, order, self.progress.generated) == REPEAT

    def prefill(self, name: str, n_missing: int, max_tokens: int) -> bool:
        """Whether a model drafter should take the prompt before the first step.

        Catching up on the prompt costs the same whenever it happens (one batch); doing it
        up front only pays if the drafter is then expected to save more than that over the
        request: (plain seconds per token - its seconds per token) x the tokens to come that
        the lookups are not expected to cover (uncovered), over what this request's
        acceptance may be (`gain`), > its measured seconds per prompt token x n_missing.
        Until that cost has been measured once (at a first use, which the plans charge),
        nothing is prefilled.
        """
        self.progress.max_tokens = max_tokens
        if name not in self.setup.names or name in FREE or max_tokens < 2:  # one token: nothing to draft
            return False
        if self.repeating():  # the same request again: copied; a catch-up, if ever needed, comes then
            return False
        with self.ctl.lock:
            self.lags.missing[name] = n_missing
            if n_missing > 0:  # (none: its cache holds the prompt already, nothing to pay)
                per_token = self.ctl.costs.prompt_cost.get(name)
                V = self.ctl.costs.verify.table(self.setup.cap + 1)
                if per_token is None or V is None:
                    return False
                tokens = min(self.prefill_horizon(), max_tokens - 1) * self.uncovered()
                if self.gain(self, name, V, tokens) <= per_token * n_missing:
                    return False
        self.lags.took_prompt(name)
        return True

    def prefilled(self, name: str, n_tokens: int, seconds: float) -> None:
        """Told what a prefill cost: the prompt's catch-up rate, for the next decisions."""
        if n_tokens > 0:
            with self.ctl.lock:
                self.ctl.learn_prompt_cost(name, seconds / n_tokens)


Gain = Callable[[Prefill, str, list, float], float]  # (part, drafter, V, tokens) -> seconds saved


def spread_gain(part: Prefill, name: str, V, tokens: float) -> float:
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
    ctl, setup = part.ctl, part.setup
    m, sd = hot.level(ctl, name, setup.kind)
    # what a second of the request is worth: with lookups, the rate its kind has run at (the tokens a draft
    # model would draft around a lookup's break are ones the lookup copies at that rate); without, plain's
    speedup = ctl.history.speedup(setup.kind) if setup.has_lookups else None
    value = max(speedup or 1.0, 1.0) / V[1]
    total = 0.0
    for x in (m - sd, m, m + sd):
        p = hot.plan_at(ctl, setup, part.est, name, V, x)
        if not p.k:
            continue
        # tokens a draft-model step makes beyond a plain one's, less what its extra seconds make at `value`;
        # in seconds, per token it drafts for
        gain = (p.tokens - value * p.seconds - 1.0 + value * V[1]) / value
        total += tokens * gain / p.tokens if gain > 0 else _TRIAL_STEPS * gain
    return total / 3.0
