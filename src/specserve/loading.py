"""Load an engine and check its pair: what `specserve generate/serve/bench/check` and every replica do first.

The pairing check (pairing.py) runs before anything is generated: a flagrant mismatch refuses the
draft (`PairingRefused`), a subtle one comes back as warnings for the caller to show.
"""
from __future__ import annotations

from .config import ModelConfig
from .engine import Engine
from .pairing import check_pairing


class PairingRefused(ValueError):
    """The draft cannot serve the target: what differs, one problem per item."""

    def __init__(self, problems: list[str]):
        super().__init__("draft model refused: " + "; ".join(problems))
        self.problems = problems


def load_checked(cfg: ModelConfig) -> tuple[Engine, list[str]]:
    """The engine for `cfg` and the pairing check's warnings.

    Raises FileNotFoundError, ValueError or MemoryError where a model does not load, and
    PairingRefused (the engine closed again) where the draft cannot serve the target."""
    engine = Engine.load(cfg)
    if engine.draft is None:
        return engine, []
    report = check_pairing(engine.target, engine.draft)
    if report.flagrant:
        engine.close()
        raise PairingRefused(report.problems)
    return engine, list(report.warnings)
