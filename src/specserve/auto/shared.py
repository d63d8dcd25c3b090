"""What a request's policy reads and tells of the engine-level state it shares (controller.py).

A Protocol, so that request.py and its parts depend on this contract, not on the Controller that
makes them: the Controller implements it, and nothing here imports upward. Every call is made with
`lock` held (see controller.py's threads note).
"""
from __future__ import annotations

import threading
from typing import Protocol

from .cost import Costs
from .history import History
from .pacing import Pacing
from .priors import Priors


class Shared(Protocol):
    """The engine's pooled state as a request's policy sees it: read through its parts (their reads,
    e.g. `priors.prior`, `costs.draft_coef`, `pacing.probe_interval`: a step makes ~15 of them, so not
    through forwarding calls), changed only through the verbs below (and the maps' and shapes' own
    `add`)."""

    lock: threading.Lock
    costs: Costs  # what a target pass, a drafter's steps and a prompt's catch-up cost (cost.py)
    priors: Priors  # pooled acceptance, its spread and shape, the confidence maps (priors.py)
    pacing: Pacing  # the clock, when each drafter last drafted, probe intervals, lookups never probed (pacing.py)
    history: History  # what requests have been: their counts, lengths, the lookups' share (history.py)

    def passed(self, n_drafted: int, t_draft: float, t_verify: float, n_tokens: int) -> None: ...
    def learn_pooled(self, name: str, order: int, regime: float, hit: int, tried: int,
                     delivered: int | None = None, asked: int | None = None) -> None: ...
    def learn_draft_cost(self, name: str, n: int, lag: int, seconds: float) -> None: ...
    def learn_prompt_cost(self, name: str, per_token: float) -> None: ...
    def learn_probe(self, name: str, paid: bool) -> None: ...
    def drafted_with(self, name: str) -> None: ...
    def judged_unasked(self, name: str) -> None: ...
    def learn_spread(self, name: str, order: int, regime: float, rate: float, tried: float) -> None: ...
    def learn_length(self, n_tokens: int) -> None: ...
    def learn_lookup_share(self, regime: float, covered: float, tokens: int) -> None: ...
    def learn_speedup(self, kind: float | str, tokens: int, passes: float) -> None: ...
