"""How far each drafter's cache is behind one request's text, and what catching up costs.

A drafter not run in a step falls behind by the step's tokens; a draft model that drafts holds all
but the bonus token (and its own last draft token, where that was rejected). Until it first runs in
the request (`fresh`), its cache also lacks the prompt: `missing` tokens, which it catches up on at
its first step or up front (prefill.py).
"""
from __future__ import annotations

from .names import FREE
from .shared import Shared


class Lags:
    """Each drafter's lag behind the request's text, and whether it holds the prompt yet."""

    def __init__(self, ctl: Shared, names: list[str], cap: int):
        self.ctl, self.cap = ctl, cap
        self.lag = dict.fromkeys(names, 0)  # tokens the drafter's cache is behind (after the prompt)
        self.fresh = set(names)  # not run in this request: its cache also lacks the prompt
        self.missing = dict.fromkeys(names, 0)  # prompt tokens a fresh drafter's cache lacks

    def catchup(self, name: str, V, uncovered: float = 1.0) -> float:
        """Seconds the drafter will spend catching up beyond an in-step draft's: the prompt's
        (`start`) and the tokens others made since it last ran (`owed`)."""
        return self.start(name, uncovered) + self.owed(name, V)

    def start(self, name: str, uncovered: float = 1.0) -> float:
        """Seconds a drafter that has not run in this request owes for the prompt, over `uncovered`
        (paid once, it is repaid by that share of the request's tokens: to be spread over them)."""
        if name in FREE or name not in self.fresh:
            return 0.0  # a lookup indexes the tokens it missed in microseconds a token
        return self.ctl.costs.prompt_cost.get(name, 0.0) * self.missing[name] / uncovered

    def owed(self, name: str, V) -> float:
        """Seconds of catch-up on the tokens other drafters made since it last ran: the step that runs
        it pays them, and pays again after their next run (not a cost to spread over the request)."""
        if name in FREE:
            return 0.0
        return self.ctl.costs.draft_coef(name, V)[2] * max(self.lag[name] - 2, 0)

    def fell_behind(self, names, n: int) -> None:
        """These drafters did not run while the step made n tokens."""
        for name in names:
            self.lag[name] += n

    def ran(self, name: str, all_kept: bool) -> None:
        """The drafter drafted: its cache holds all but the bonus (and its last draft token, unless kept)."""
        self.lag[name] = 2 if all_kept else 1
        self.fresh.discard(name)

    def took_prompt(self, name: str) -> None:
        """The drafter took the prompt up front."""
        self.fresh.discard(name)
        self.lag[name] = 1  # the prompt's last token, which every step feeds

    def learn_cost(self, name: str, n: int, extra: int, t_draft: float) -> None:
        """Seconds a drafter took for n tokens, its cache `extra` tokens further behind than its lag."""
        ctl = self.ctl
        if name in self.fresh:  # the prompt's catch-up: what the regression does not explain
            if self.missing[name] > 0 and name not in FREE:
                a, b, c = ctl.costs.draft_coef(name, ctl.costs.verify.table(self.cap + 1))
                over = max(t_draft - a - b * n - c * (self.lag[name] + extra), 0.0)
                ctl.learn_prompt_cost(name, over / self.missing[name])
        else:
            ctl.learn_draft_cost(name, n, self.lag[name] + extra, t_draft)
