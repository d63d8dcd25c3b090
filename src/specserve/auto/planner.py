"""The planner: rates and costs in, (drafter, k) out. Pure: no model, no clock, no threads.

A step that drafts k tokens and verifies them with the last committed token in one pass
makes, in expectation,

    E[tokens](k)  = 1 + sum_{j=1..k} prod_{i<=j} d_i a_i
    E[seconds](k) = sum_{l<=k} P(len = l) (draft(l) + verify(1 + l)),  P(len >= j) = prod_{i<=j} d_i

a_i = P(draft token i accepted | 1..i-1 accepted); d_i = P(the drafter returns an i-th
token | it returned i - 1): 1 for a lookup whose match is known, learnt for a draft model
that may stop early. With every d_i = 1 this is the textbook 1 + sum_j prod_{i<=j} a_i
over verify(k + 1) + draft(k). Each drafter's k maximises E[tokens] / E[seconds] up to its
cap (a lookup: the request's suffix_max, 64 by default and lowered by a --draft-max the user
set, so a long, well-predicted match drafts long; a draft model: --draft-max); `pick` then takes the
drafter with the best rate after its catch-up, or plain decoding (k = 0: 1 token per verify(1)) when
nothing pays.

A hybrid step drafts the lookup's m matched tokens for free (`head`: their acceptance),
then lets the draft model continue from where the match ends: its first batch also takes
the m lookup tokens (c seconds each), and the positions after the head are verified in
the same pass.

`ConfidenceStop` is the draft model's stopping rule inside one step: before keeping a
drafted token it looks up what the draft's top probability there predicts (a learnt
map) and stops when that token's expected gain no longer pays for its seconds.
"""
from __future__ import annotations

import bisect
from typing import NamedTuple, Sequence

_TAIL = 0.02  # positions reached with all accepted below this add too little to plan further


class Plan(NamedTuple):
    rate: float  # expected tokens per second of the step
    k: int  # tokens to draft, the hybrid's lookup tokens included; 0: plain decoding
    tokens: float  # E[tokens] the step makes
    seconds: float  # E[seconds] it takes (drafting + verifying; catch-up excluded)
    m: int = 0  # of the k, tokens a lookup drafts ahead of the draft model (a hybrid)


class Option(NamedTuple):
    """One drafter as the planner sees it this step.

    acc: [>= kmax] a_i; dlv: [>= kmax] d_i, or None (every token up to kmax is returned);
    cost: (a, b, c), seconds to draft n tokens after a lag of `lag` = a + b n + c (lag - 1);
    found: the drafter returns a first token (d_1 = 1); head: a hybrid's lookup tokens'
    acceptance; catchup: seconds the drafter still owes beyond an in-step draft (a cache
    behind the sequence), spread over the tokens the request is still expected to make.
    """

    name: str
    acc: Sequence[float]
    cost: tuple[float, float, float]
    kmax: int
    kmin: int = 1
    dlv: Sequence[float] | None = None
    found: bool = False
    head: Sequence[float] = ()
    catchup: float = 0.0


def plain(V: Sequence[float]) -> Plan:
    """No draft: one token per pass over one token."""
    return Plan(1.0 / V[1], 0, 1.0, V[1])


def best_length(o: Option, V: Sequence[float]) -> Plan:
    """The k in [kmin, kmax] (after the head) with the highest E[tokens] / E[seconds].

    V: [>= len(head) + kmax + 2] seconds of a target pass over n tokens (index 0 unused).
    A plan with k = 0 means no k in range drafts anything (kmax < kmin).
    """
    a, b, c = o.cost
    m = len(o.head)
    e_tok, chain = 1.0, 1.0
    for x in o.head:  # the lookup's tokens: returned for sure, free to draft
        chain *= x
        e_tok += chain
    a += c * m  # the draft model takes them in its first batch
    best_r, best_k, best_e, best_t = 0.0, 0, 1.0, V[m + 1]
    reach, s = 1.0, 0.0  # P(len >= i); E[seconds] of the steps whose draft came back shorter
    c_prev = a + V[m + 1]  # seconds of a step whose draft came back with i - 1 tokens
    # (the cache then misses 2 tokens instead of 1 after a fully accepted draft: + c chain)
    for i in range(1, o.kmax + 1):
        d = 1.0 if o.dlv is None or (o.found and i == 1) else o.dlv[i - 1]
        r = reach * d
        s += (reach - r) * c_prev
        reach, chain = r, chain * d * o.acc[i - 1]
        e_tok += chain
        c_prev = a + b * i + c * chain + V[m + i + 1]
        t = s + reach * c_prev
        if i >= o.kmin:
            if e_tok > best_r * t:
                best_r, best_k, best_e, best_t = e_tok / t, i, e_tok, t
            if chain < _TAIL:
                break
    return Plan(best_r, m + best_k if best_k else 0, best_e, best_t, m if best_k else 0)


def worth(tokens: float, seconds: float, V: Sequence[float]) -> float | None:
    """Tokens a second of the request is worth: its rate so far (`tokens` in its steps' `seconds`), at
    least plain decoding's (always at hand); None before its first step (nothing to go by yet)."""
    return max(tokens / seconds, 1.0 / V[1]) if seconds > 0 else None


def steady(V: Sequence[float], plans: Sequence[tuple]) -> float:
    """The most tokens per second an option of this step makes before any catch-up: what a second is
    worth where no copy is on to come back to (request.AutoPolicy.best)."""
    return max([1.0 / V[1]] + [p.tokens / p.seconds for _, p, *_ in plans if p.k])


def pick(V: Sequence[float], plans: Sequence[tuple], horizon: float,
         value: float | None = None) -> tuple[str | None, Plan, float]:
    """(drafter or None, its plan, its rate after catch-up): the best of plain decoding and each
    (name, plan, catch-up seconds[, seconds owed]). Catch-up seconds are spread over `horizon` tokens
    (a prompt's, paid once); seconds owed are the step's own (a cache behind by the tokens others made).

    Best: the most tokens per second of the step, or given `value` (`worth`), the most tokens less
    what its seconds would make at that rate. A step is one of many: one that makes 3.7 tokens at
    10 tok/s (a draft model after a copy's break, with the copy's tokens to catch up on) costs more
    than it makes where the request runs at 20 and a plain step lets the copy resume.
    Ties go to plain decoding, then to the earlier option."""
    best_name, best, best_rate = None, plain(V), 1.0 / V[1]
    best_score = 1.0 - value * V[1] if value is not None else best_rate
    for name, p, catchup, *owed in plans:
        if not p.k:
            continue  # nothing to draft
        seconds = p.seconds + sum(owed) + p.tokens * catchup / horizon
        rate = p.tokens / seconds
        score = rate if value is None else p.tokens - value * seconds
        if score > best_score:
            best_name, best, best_rate, best_score = name, p, rate, score
    return best_name, best, best_rate


def plan(V: Sequence[float], options: Sequence[Option], horizon: float = 1e9) -> tuple[str | None, Plan]:
    """The drafter and plan with the most expected tokens per second this step (None: plain decoding)."""
    name, p, _ = pick(V, [(o.name, best_length(o, V), o.catchup) for o in options], horizon)
    return name, p


def step_costs(V: Sequence[float], b: float, m: int, k: int) -> tuple[float, ...]:
    """[k] seconds that keeping draft token i (0-based, after m head tokens) adds to a draft of at most k.

    Its share of the pass, V[m + i + 2] - V[m + i + 1], and, but for the last token the plan
    allows, b: the draft model evaluates a kept token to draft the next one. The last is
    never evaluated, so the stop there weighs the pass alone: charged b as well, it asked 4x
    the expected gain of a 2-token plan's last token on this CPU (b is 3x a token's share of
    the reference pair's pass), and declined tokens that a fixed draft of k keeps."""
    return tuple((b if i < k - 1 else 0.0) + V[m + i + 2] - V[m + i + 1] for i in range(k))


class ConfidenceStop:
    """Whether the draft model should stop before keeping draft token i, given its top probability p.

    acceptance: [buckets] P(accepted | top probability in bucket), by `bucket(p)`; costs:
    `step_costs`; tokens, seconds: E[tokens] and seconds of the step with no model token
    (the head's and the bonus token; the model's first evaluation and the pass over the
    head); chain: P(the head is all accepted). Token i is kept while its expected gain
    chain_i a(p) per its seconds beats the rate so far: adding it raises E[tokens] / seconds.
    Tokens before kmin are always kept (--draft-min). One instance per step: it keeps the
    running chain.
    """

    def __init__(self, acceptance: Sequence[float], edges: Sequence[float], costs: Sequence[float],
                 tokens: float, seconds: float, chain: float = 1.0, kmin: int = 0):
        self.acceptance, self.edges, self.costs = acceptance, edges, costs
        self.tokens, self.seconds, self.chain, self.kmin = tokens, seconds, chain, kmin

    def __call__(self, i: int, p: float) -> bool:
        if i >= len(self.costs):
            return True
        a = self.acceptance[bisect.bisect_right(self.edges, p)]
        gain = self.chain * a
        if i >= self.kmin and not self._run_pays(i, gain, a):
            return True
        self.chain, self.tokens, self.seconds = gain, self.tokens + gain, self.seconds + self.costs[i]
        return False

    def _run_pays(self, i: int, gain: float, a: float) -> bool:
        """Whether keeping tokens i..j raises the step's rate for some j up to the plan's last:
        token i alone, or with the next ones, each as likely as this one (their probabilities are
        not drafted yet). A pass that grows by steps (on this CPU a pass over 4 tokens costs a
        third more than over 3, over 5-7 little more) makes the first token past a step dear and
        the next ones cheap: judged alone it stops every draft before the step."""
        tokens, seconds = self.tokens, self.seconds
        g = d = 0.0
        for j in range(i, len(self.costs)):
            g, d = g + gain, d + self.costs[j]
            if g * seconds > tokens * d:
                return True
            gain *= a
            if gain < _TAIL:
                break
        return False
