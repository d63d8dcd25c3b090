"""Where the `--spec auto` controller used to live; it is the `auto` package now."""
from .auto.acceptance import match_bucket
from .auto.controller import Controller
from .auto.cost import CostModel, DraftCost, VerifyCost
from .auto.policy import _PROBE_MAX, _PROBE_MIN, LOOKUP_MAX, AutoPolicy

_DraftCost = DraftCost  # the name tests of the first controller use

__all__ = ["AutoPolicy", "Controller", "CostModel", "DraftCost", "LOOKUP_MAX", "VerifyCost", "match_bucket",
           "_PROBE_MAX", "_PROBE_MIN", "_DraftCost"]
