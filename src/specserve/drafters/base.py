"""The drafter interface: propose up to k tokens, then learn how many were kept.

A drafter proposes a continuation of the committed sequence. `probs` carries the
draft's processed distribution at each drafted position when it has one (a draft
model); None means the draft is deterministic (n-gram lookup), which the verifier
treats as q = one-hot. "No draft" is an empty Draft, never None. `confidence`, when
a drafter gives one, is its own estimate that each token is right given the ones
before it (the suffix drafter: how often that token followed, among the earlier
occurrences that agree so far); the verifier never reads it, a policy may.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..config import SamplingParams


@dataclass
class Draft:
    tokens: list[int]
    probs: np.ndarray | None = None  # [len(tokens), n_vocab] float32, or None (deterministic)
    confidence: list[float] | None = None  # [len(tokens)] per-token estimate in (0, 1], or None

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[])


class Drafter(Protocol):
    """Made fresh for each request; state that outlives a request (a KV cache) is passed in."""

    name: str

    def propose(self, seq: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Propose up to k tokens that follow `seq` (prompt + committed output)."""
        ...

    def accepted(self, n: int) -> None:
        """Told after verification how many of the last proposal's tokens were kept."""
        ...
