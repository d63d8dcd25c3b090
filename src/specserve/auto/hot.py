"""Hot sampling (issue 60 item 2): what a draft model's pooled acceptance says it may win at a kind.

At temperature 0.8 on the reference pair's CPU a 2-token pass costs 1.7 plain ones, and the 0.5B keeps
about 0.67 of its tokens on a story: it does not pay at any k. From an empty profile auto still took
the story's prompt into the draft model wherever one spread of requests above the pooled rate paid,
and spent its exploring allowance on 1-token probes in every story (0.963-0.976x the target alone in
the replay). At a hot regime, therefore:

- a request explores it beyond the 1% budget only while the kind's pooled rate, one spread above
  (`may_pay`), would pay: what the engine has seen of the kind rules it out, or does not;
- a probe's success is followed up at once only while that optimistic level pays;
- a probe drafts at least the tokens that could pay if all were kept (probing.Probes.probe_k): a
  1-token draft whose 2-token pass costs more than the 2 tokens it makes at best shows nothing
  the plan could use;
- a draft model that took the prompt up front on the spread's bet (prefill.spread_gain) is probed at
  the request's first step (probing.Probes.owed): the catch-up buys the answer it was taken for.

The lookups are never probed once the engine judges them unasked (probing.Probes.due): their drafts
are judged at every step where they match, for free (estimates.learn_shadow).

Replayed (6 stories at 0.8 on this CPU's costs, 12 seeds, tests/auto/replay.py), x the target alone:
the draft keeping 0.67, 0.973 before, 0.980 after; keeping 0.9 (where it pays), 1.070 before, 1.086
after. Taking the prompt up front only where the pooled rate itself pays (not over its spread) made
the 0.67 stories 0.981-0.984 and cost the 0.9 ones 1-2%: not kept. The remaining loss is the first
story's exploring (about 5%) and the 1% budget's re-checks, each paying the prompt's catch-up.
"""
from __future__ import annotations

import math

from . import planner
from .acceptance import PRIOR_W

HOT = 0.75  # the regime (temperature in 0.25 steps) from which a request samples hot: temperature >= ~0.63


def level(ctl, name: str, kind) -> tuple[float, float]:
    """(pooled rate, its spread) of a drafter at a kind: the spread of requests (Spread) and the pooled
    rate's own uncertainty over its trials, as prefill.spread_gain weighs them."""
    q = ctl.priors.prior(name, 0, kind)
    m = q[0] / q[1]
    sp = ctl.priors.spread.get((name, 0, kind))
    w = sp.weight(m) if sp is not None else PRIOR_W
    return m, math.sqrt(m * (1.0 - m) * (1.0 / (w + 1.0) + 1.0 / (q[1] + 1.0)))


def plan_at(ctl, setup, est, name: str, V, x: float) -> planner.Plan:
    """The drafter's best plan if every position kept `x`."""
    q = ctl.priors.prior(name, 0, setup.kind)
    acc = [min(max(x, 0.0), 0.99)] * setup.caps[name]
    option = planner.Option(name, acc, tuple(ctl.costs.draft_coef(name, V)), setup.caps[name], setup.kmin[name],
                            est.dlv[name].rates(q[2] / q[3]))
    return planner.best_length(option, V)


def may_pay(ctl, setup, est, name: str, V) -> bool:
    """Whether the drafter pays at the kind's pooled rate one spread above (beats plain decoding)."""
    m, sd = level(ctl, name, setup.kind)
    p = plan_at(ctl, setup, est, name, V, m + sd)
    return bool(p.k) and p.rate * V[1] > 1.0
