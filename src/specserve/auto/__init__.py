"""`--spec auto`: speculate only while it pays, planned each step on expected tokens per second.

cost.py measures what steps cost, acceptance.py learns how often drafts are kept,
planner.py (pure) turns both into this step's (drafter, k); request.py is one request's
policy (AutoPolicy, the protocol of ../policy.py), with what it learns from each step in
learning.py, its probes of unused drafters in probing.py and its prefill judgement in
prefill.py; controller.py holds the state an engine's requests share. Imports run one way:
controller -> request -> learning/probing/prefill -> planner/acceptance/cost.
"""
from .controller import Controller
from .request import AutoPolicy

__all__ = ["AutoPolicy", "Controller"]
