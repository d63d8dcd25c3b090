"""`--spec auto`: speculate only while it pays, planned each step on expected tokens per second.

cost.py measures what steps cost, acceptance.py learns how often drafts are kept,
planner.py (pure) turns both into this step's (drafter, k), policy.py keeps one
request's bookkeeping and probes, controller.py the state an engine's requests share.
"""
from .controller import Controller
from .policy import AutoPolicy

__all__ = ["AutoPolicy", "Controller"]
