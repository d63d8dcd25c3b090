"""Controllers and policies for the tests of AutoPolicy's planning: a controller that has measured given costs,
and a policy with its probes held off."""
from __future__ import annotations

from specserve.auto import Controller
from specserve.auto.cost import DraftCost

NAMES = ["draft", "ngram", "suffix", "hybrid"]  # what an engine with a draft model offers auto


def measured(verify, draft_per_token: float, passes=(1, 2, 4, 8, 16, 33, 65)) -> Controller:
    """A controller that has measured `verify` and a draft model at `draft_per_token` seconds a token."""
    ctl = Controller()
    for _ in range(3):
        for n in passes:
            ctl.costs.verify.add(n, verify(n))
    fit = ctl.costs.draft["draft"] = DraftCost()
    for n, lag in [(1, 1), (4, 2), (8, 1), (2, 9), (6, 2), (3, 30)] * 5:
        fit.add(n, lag, draft_per_token * (1 + n + 0.4 * (lag - 1)))
    return ctl


def no_probes(policy) -> None:
    """Probing off: these tests are about the plan (a drafter never used would be probed at once)."""
    for name in policy.names:
        policy.ctl.pacing.interval[name] = 1 << 40
