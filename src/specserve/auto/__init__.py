"""`--spec auto`: speculate only while it pays, planned each step on expected tokens per second.

cost.py measures what steps cost, acceptance.py learns how often drafts are kept,
planner.py (pure) turns both into this step's (drafter, k). request.py is one request's
policy (AutoPolicy, the protocol of ../policy.py), composed of parts that own their state:
its acceptance estimates (estimates.py), its drafters' lags (lags.py), its probes of unused
drafters (probing.py), its prefill judgement (prefill.py) and its plan cache (plans.py), with
what each step teaches them in learning.py, its drafters and progress in progress.py and what
the parts share in context.py. controller.py holds the state an engine's requests share, in parts:
costs (cost.py), acceptance priors (priors.py), probe pacing (pacing.py) and what requests have been
(history.py); the requests see it through the Shared protocol (shared.py) and change it through its
verbs. Imports run one way: controller -> request -> learning -> probing/prefill -> context ->
estimates/lags -> shared -> cost/priors/pacing/history -> planner/acceptance.
"""
from .controller import Controller
from .request import AutoPolicy

__all__ = ["AutoPolicy", "Controller"]
