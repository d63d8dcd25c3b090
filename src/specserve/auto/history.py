"""What an engine's requests under `--spec auto` have been: how many, how long, how much lookups covered.

Engine-level, shared by the requests (controller.py holds it), kept across processes: decayed counts of
requests and their tokens (a request's horizon: prefill.Prefill.horizon), the last requests' lengths
(the horizon a prefill is judged over) and, per kind of work (kinds.py), the share of the tokens made
that a lookup drafted and kept or would have (what a draft model's prompt catch-up is left: Prefill.uncovered),
and how fast such requests ran, in plain passes (what a second of the next one is worth before its first
step: prefill.spread_gain).
"""
from __future__ import annotations

from .kinds import kind_key

LENGTHS = 32  # finished requests whose lengths are kept (prefill.Prefill.prefill_horizon)
_G_SHARE = 0.9  # per-request decay of the lookups' share: about the last 10 requests


class History:
    """The engine's requests so far."""

    def __init__(self):
        self.requests, self.tokens = 1.0, 256.0  # decayed counts; a prior of 256 tokens a request
        self.lengths: list[int] = []  # tokens the last LENGTHS finished requests made, oldest first
        # kind (kinds.py) -> decayed [tokens a lookup drafted and kept or would have (its shadow), tokens made]
        self.lookup_share: dict[float | str, list[float]] = {}
        # kind -> decayed [tokens made, their seconds in plain passes (seconds / a pass over one token)]
        self.speedups: dict[float | str, list[float]] = {}

    def began(self) -> None:
        """A request began."""
        self.requests, self.tokens = 0.9 * self.requests + 1, 0.9 * self.tokens

    def learn_length(self, n_tokens: int) -> None:
        """A finished request made n_tokens."""
        self.lengths = [*self.lengths[1 - LENGTHS:], int(n_tokens)]

    def share_of_lookups(self, regime: float | str) -> float:
        """Of the tokens recent requests of this kind (kinds.py) made, the share a lookup drafted and kept
        or would have kept (0 before any request ended)."""
        covered, tokens = self.lookup_share.get(regime, (0.0, 0.0))
        return covered / tokens if tokens > 0 else 0.0

    def learn_lookup_share(self, regime: float | str, covered: float, tokens: int) -> None:
        """A finished request made `tokens`, of which lookups covered `covered`."""
        if tokens > 0:
            c = self.lookup_share.get(regime, [0.0, 0.0])
            self.lookup_share[regime] = [c[0] * _G_SHARE + covered, c[1] * _G_SHARE + tokens]

    def speedup(self, kind: float | str) -> float | None:
        """Tokens recent requests of this kind made per plain pass's seconds (None before one ended):
        their rate over plain decoding's, which a machine busier or quieter than now moves little."""
        tokens, passes = self.speedups.get(kind, (0.0, 0.0))
        return tokens / passes if passes > 0 else None

    def learn_speedup(self, kind: float | str, tokens: int, passes: float) -> None:
        """A finished request made `tokens` in the seconds of `passes` plain passes."""
        if tokens > 0 and passes > 0:
            c = self.speedups.get(kind, [0.0, 0.0])
            self.speedups[kind] = [c[0] * _G_SHARE + tokens, c[1] * _G_SHARE + passes]

    def state(self) -> dict:
        """Its sections of a saved profile (controller.Controller.state_dict)."""
        return {"requests": self.requests, "tokens": self.tokens, "lengths": list(self.lengths),
                "lookup_share": [[regime, *counts] for regime, counts in self.lookup_share.items()],
                "speedup": [[kind, *counts] for kind, counts in self.speedups.items()]}

    @classmethod
    def from_state(cls, state: dict, weight: float) -> "History":
        """From a saved profile, the lookups' share scaled by `weight` (Controller.load_state_dict)."""
        h = cls()
        for regime, *counts in state.get("lookup_share", []):  # (absent in older profiles)
            if len(counts) != 2 or min(counts) < 0 or counts[0] > counts[1]:
                raise ValueError("lookup share counts of the wrong shape")
            h.lookup_share[kind_key(regime)] = [float(c) * weight for c in counts]
        for kind, *counts in state.get("speedup", []):  # (absent in older profiles)
            if len(counts) != 2 or min(counts) < 0:
                raise ValueError("speedup counts of the wrong shape")
            h.speedups[kind_key(kind)] = [float(c) * weight for c in counts]
        h.requests, h.tokens = float(state["requests"]), float(state["tokens"])
        h.lengths = [int(n) for n in state.get("lengths", [])][-LENGTHS:]  # (likewise)
        return h
