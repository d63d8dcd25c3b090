"""Prompt-lookup drafting: no model, just the sequence itself.

Find the most recent earlier occurrence of the last n tokens (longest n first) in
prompt + output and propose what followed it. An incremental index (n-gram ->
latest end position) makes each proposal O(n_max) instead of a scan of the
sequence; it is rebuilt only when the sequence is not an extension of what was
indexed (a new request).
"""
from __future__ import annotations

from typing import Sequence

from ..sampling import Sampler
from .base import EMPTY_DRAFT, BaseDrafter, Draft, Offer


class NgramDrafter(BaseDrafter):
    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []  # the sequence the index describes
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.n_max + 1)]
        self._indexed_to = 0  # n-grams ending at positions < this are in the index

    def _sync(self, seq: Sequence[int]) -> None:
        n_old = len(self._seq)
        if len(seq) < n_old or list(seq[:n_old]) != self._seq:
            self.reset()
            n_old = 0
        self._seq.extend(seq[n_old:])

    def _index_until(self, end: int) -> None:
        """Index every n-gram ending (exclusively) at positions in [_indexed_to, end)."""
        s = self._seq
        for e in range(self._indexed_to, end):
            for n in range(self.n_min, min(self.n_max, e) + 1):
                self._index[n][tuple(s[e - n : e])] = e
        self._indexed_to = max(self._indexed_to, end)

    def _lookup(self, seq: Sequence[int]) -> tuple[int, int]:
        """(n, end): the longest n whose last-n-gram occurred before, ending at end; (0, -1) if none."""
        self._sync(seq)
        n_seq = len(self._seq)
        if n_seq < self.n_min + 1:
            return 0, -1
        # index n-grams ending before the current suffix, so a match is always an earlier one
        self._index_until(n_seq)
        for n in range(min(self.n_max, n_seq - 1), self.n_min - 1, -1):
            end = self._index[n].get(tuple(self._seq[n_seq - n :]))
            if end is not None and end < n_seq:
                return n, end
        return 0, -1

    def peek(self, seq: Sequence[int]) -> Offer:
        """The n of the n-gram a proposal would follow now (0: none) and how many tokens follow
        its earlier occurrence. A dict lookup: cheap enough for every step."""
        n, end = self._lookup(seq)
        return Offer(n, len(self._seq) - end) if n else Offer(0, 0)

    match = peek  # the name the controller's first version used

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        n, end = self._lookup(seq)
        return Draft(tokens=self._seq[end : end + k]) if n else EMPTY_DRAFT
