"""Drafters: cheap proposers of continuations for the target to verify."""
from .base import EMPTY_DRAFT, Draft, Drafter

__all__ = ["Draft", "Drafter", "EMPTY_DRAFT"]
