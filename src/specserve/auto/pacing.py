"""The engine's probe pacing under `--spec auto`: when its requests may try an unused drafter again.

Engine-level, shared by the requests (controller.py holds it): the seconds of drafting and verifying
observed, when each drafter last drafted, the steps between probes of each (doubled after a probe that
did not pay), the lookups judged at every step unasked (never probed) and the drafters a loaded profile
measured. A request's own probes are probing.py's. Not kept across processes: it is the moment's.
"""
from __future__ import annotations

PROBE_MIN, PROBE_MAX = 4, 32  # steps between probes of an unused drafter


class Pacing:
    """When the engine's requests probe unused drafters."""

    def __init__(self):
        self.clock = 0.0  # seconds of drafting and verifying observed, all requests
        self.last_used: dict[str, float] = {}  # self.clock when the drafter last drafted, any request
        self.interval: dict[str, int] = {}  # probe interval, steps
        self.shadowed: set[str] = set()  # lookups the engine judges at every step (Outcome.shadow): never probed
        self.profiled: frozenset[str] = frozenset()  # drafters the loaded profile measured

    def probe_interval(self, name: str) -> int:
        """Steps between probes of an unused drafter."""
        return self.interval.get(name, PROBE_MIN)

    def learn_probe(self, name: str, paid: bool) -> None:
        """A probe that drafted: probe again at once if it paid (or would have), else wait twice as long."""
        iv = self.probe_interval(name)
        self.interval[name] = 1 if paid else min(max(2 * iv, PROBE_MIN), PROBE_MAX)

    def drafted_with(self, name: str) -> None:
        """The drafter drafted now (its probes are paced from here)."""
        self.last_used[name] = self.clock

    def judged_unasked(self, name: str) -> None:
        """A lookup was judged against a step's tokens without drafting (Outcome.shadow): never probe it."""
        self.shadowed.add(name)
