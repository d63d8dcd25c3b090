"""One request's cache of planner results: plans and confidence-stop costs, per cost table."""
from __future__ import annotations

from . import planner
from .names import HYBRID


class PlanCache:
    """Plans by drafter and key, valid while the cost table V is the same object and the drafter's
    estimates have not changed (`forget`)."""

    def __init__(self, names: list[str]):
        self.V: list[float] | None = None  # the cost table the cached plans were made with
        self.plans: dict[str, dict[tuple, planner.Plan]] = {n: {} for n in [*names, HYBRID]}
        self.costs: dict[tuple[int, int], tuple[float, ...]] = {}  # (head length, k) -> seconds per draft token

    def check(self, V) -> None:
        if V is not self.V:  # costs moved: every cached plan is stale
            self.V, self.costs = V, {}
            for plans in self.plans.values():
                plans.clear()

    def forget(self, *names: str) -> None:
        """Their estimates changed: their cached plans, and the hybrid's, are stale."""
        for name in names:
            self.plans[name].clear()
        self.plans[HYBRID].clear()

    def step_costs(self, V, b: float, m: int, k: int) -> tuple[float, ...]:
        costs = self.costs.get((m, k))
        if costs is None:
            costs = self.costs[m, k] = planner.step_costs(V, b, m, k - m)
        return costs
