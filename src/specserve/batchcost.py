"""What a batched forward pass costs as a function of the tokens it holds, and each sequence's share.

Adding k draft tokens to a pass that already holds B tokens does not cost what a
single-sequence pass of 1 + k tokens costs: the weights are read once for the whole batch
(the fixed part of a CPU pass), so the marginal cost of a token falls as the batch grows,
until compute dominates. The batch scheduler tells `add` every pass; `charge` turns a pass
into each sequence's marginal cost, cost(B) - cost(B - n), which the engine reports to the
policy as that step's verification (or drafting) time. `--spec auto` then weighs a draft
against what it adds to the batch actually running, without knowing about batches.

cost(n) is learnt per total token count (an exponential average of measured seconds) and
interpolated linearly between counts seen, with cost(0) = 0, extrapolated past the largest
with the slope of the last segment. `most_tokens` inverts it: how many tokens a pass may
hold within a time limit (the batch scheduler's prompt chunks).
"""
from __future__ import annotations

import bisect

_DECAY = 0.8  # weight of the old average at each new measurement
_MAX_POINTS = 512  # counts remembered (a pass holds at most n_batch tokens)


class BatchCost:
    def __init__(self):
        self._n: list[int] = [0]  # sorted token counts seen, with 0
        self._t: list[float] = [0.0]  # their average seconds

    def add(self, n_tokens: int, seconds: float) -> None:
        """A pass of n_tokens tokens took `seconds`."""
        i = bisect.bisect_left(self._n, n_tokens)
        if i < len(self._n) and self._n[i] == n_tokens:
            self._t[i] = _DECAY * self._t[i] + (1 - _DECAY) * seconds
        elif len(self._n) < _MAX_POINTS:
            self._n.insert(i, n_tokens)
            self._t.insert(i, seconds)

    def cost(self, n_tokens: int) -> float:
        """Seconds a pass of n_tokens is expected to take: interpolated between counts seen, extrapolated
        past the largest with the last segment's slope (0 before any pass)."""
        n, t = self._n, self._t
        if len(n) < 2:
            return 0.0
        i = bisect.bisect_left(n, n_tokens)
        if i < len(n) and n[i] == n_tokens:
            return t[i]
        lo, hi = (i - 1, i) if i < len(n) else (len(n) - 2, len(n) - 1)
        return max(t[lo] + (t[hi] - t[lo]) * (n_tokens - n[lo]) / (n[hi] - n[lo]), t[lo])

    def most_tokens(self, seconds: float, lo: int, hi: int) -> int:
        """The most tokens in [lo, hi] a pass is expected to hold within `seconds` (lo if none fits;
        hi before any pass was measured)."""
        if len(self._n) < 2:
            return hi
        while lo < hi:  # cost is non-decreasing in n where passes are: bisect on it
            mid = (lo + hi + 1) // 2
            if self.cost(mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def charge(self, total: int, n: int, seconds: float) -> float:
        """A sequence's share of a pass of `total` tokens that took `seconds`, n of them its own:
        the whole pass when alone, else its marginal cost (never more than the pass, never negative)."""
        if n >= total:
            return seconds
        marginal = self.cost(total) - self.cost(total - n)
        return min(max(marginal, 0.0), seconds)
