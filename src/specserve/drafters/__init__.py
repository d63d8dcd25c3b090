"""Drafters: cheap proposers of continuations for the target to verify."""
from .base import EMPTY_DRAFT, BaseDrafter, Draft, Drafter, Offer, StopRule, propose, propose_steps
from .hybrid import LOOKUPS

__all__ = ["BaseDrafter", "Draft", "Drafter", "EMPTY_DRAFT", "LOOKUPS", "Offer", "StopRule", "propose", "propose_steps"]
