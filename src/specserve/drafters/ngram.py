"""Prompt-lookup drafting: no model, just the sequence itself.

Find the most recent earlier occurrence of the last n tokens (longest n first) in
prompt + output and propose what followed it. An incremental index (n-gram ->
latest end position) makes each proposal O(n_max) instead of a scan of the
sequence; it is rebuilt only when the sequence is not an extension of what was
indexed (a new request).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..config import SamplingParams
from .base import EMPTY_DRAFT, Draft


class NgramDrafter:
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

    def propose(self, seq: Sequence[int], k: int, params: SamplingParams | None = None,
                rng: np.random.Generator | None = None) -> Draft:
        self._sync(seq)
        n_seq = len(self._seq)
        if k <= 0 or n_seq < self.n_min + 1:
            return EMPTY_DRAFT
        # index n-grams ending before the current suffix, so a match is always an earlier one
        self._index_until(n_seq)
        for n in range(min(self.n_max, n_seq - 1), self.n_min - 1, -1):
            end = self._index[n].get(tuple(self._seq[n_seq - n :]))
            if end is not None and end < n_seq:
                return Draft(tokens=self._seq[end : end + k])
        return EMPTY_DRAFT

    def accepted(self, n: int) -> None:
        pass
