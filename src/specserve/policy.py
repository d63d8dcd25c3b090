"""Which drafter and how many tokens to draft, each step.

A Policy is asked before every step and told the outcome after it. FixedPolicy is
what `--spec draft|ngram|none` means; the adaptive policy behind `--spec auto`
lives in controller.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Choice:
    drafter: str | None  # a drafter's name, or None for plain decoding
    k: int  # draft length; 0 = plain decoding


@dataclass(frozen=True)
class Outcome:
    choice: Choice
    n_drafted: int  # may be below choice.k: drafters stop early
    n_accepted: int
    t_draft: float  # seconds spent drafting
    t_verify: float  # seconds of the target pass over 1 + n_drafted tokens


class Policy(Protocol):
    predicted_tokens_per_s: float
    sees_ngram: bool  # whether to call see_ngram(order, available) before each choose()

    def choose(self) -> Choice: ...

    def observe(self, outcome: Outcome) -> None: ...

    def prefill(self, drafter: str, n_missing: int, max_tokens: int) -> bool:
        """Whether the drafter's cache should take the prompt (n_missing tokens) before the first step."""
        ...

    def prefilled(self, drafter: str, n_tokens: int, seconds: float) -> None:
        """Told what that prefill cost."""
        ...


OFF = Choice(None, 0)


class FixedPolicy:
    """Always the same drafter and draft length."""

    predicted_tokens_per_s = 0.0
    sees_ngram = False

    def __init__(self, drafter: str | None, k: int):
        self._choice = Choice(drafter, k) if drafter and k > 0 else OFF

    def choose(self) -> Choice:
        return self._choice

    def observe(self, outcome: Outcome) -> None:
        pass

    def prefill(self, drafter: str, n_missing: int, max_tokens: int) -> bool:
        return drafter == self._choice.drafter  # it would catch up at its first step anyway

    def prefilled(self, drafter: str, n_tokens: int, seconds: float) -> None:
        pass
