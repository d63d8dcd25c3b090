"""What one request's `--spec auto` parts share: the Context each of them is made with.

The parts that judge a step (probing.py, prefill.py, learning.py) read the engine's state, the
request's drafters, its progress, its acceptance estimates and its drafters' lags; AutoPolicy
(request.py) makes these once and hands the parts one Context, not five collaborators. What a
part needs of the request's planning it is handed as functions (probing.Probes), never the policy.
"""
from __future__ import annotations

from dataclasses import dataclass

from .estimates import Estimates
from .lags import Lags
from .request_state import Progress, Setup
from .shared import Shared


@dataclass(frozen=True)
class Context:
    """One request's shared parts; each part keeps the ones it reads as its own attributes."""

    ctl: Shared  # the engine's pooled state (controller.py), every call under its lock
    setup: Setup  # the drafters it plans over, their caps, its temperature regime
    progress: Progress  # the request so far, and what its lookups offer now
    est: Estimates  # its acceptance estimates
    lags: Lags  # its drafters' lags behind the text

    @classmethod
    def of(cls, ctl: Shared, setup: Setup) -> "Context":
        """A new request's: nothing made, nothing learnt yet."""
        return cls(ctl, setup, Progress(), Estimates(ctl, setup), Lags(ctl, setup.names, setup.cap))
