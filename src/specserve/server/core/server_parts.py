"""What core reads of the server that runs it: `ServerParts`, which server/state.py's ServerState is.

core sits below the server's state (state.py builds the scheduler, metrics and slot records of core), so
core names the server by this Protocol rather than by importing ServerState: a job and the sleeper read
these parts, and nothing else, of the server they serve.
"""
from __future__ import annotations

from typing import Protocol

from ...engine import Engine
from ...grammar import GrammarWorker
from .metrics import ServerMetrics
from .scheduler import Scheduler
from .slot_records import SlotRecords


class JobSettings(Protocol):
    """The server's settings a job reads (state.py's ServerSettings has them)."""

    @property
    def template_kwargs(self) -> dict: ...  # chat template variables

    @property
    def reasoning_format(self) -> str: ...  # how a chat's reasoning block is parted from its answer

    @property
    def reasoning_budget(self) -> int: ...  # a chat's reasoning budget in tokens unless it gives one; -1: none


class ServerParts(Protocol):
    """The parts of one server that core's jobs and sleeper use."""

    engine: Engine
    scheduler: Scheduler
    metrics: ServerMetrics
    slot_records: SlotRecords
    grammars: GrammarWorker

    @property
    def settings(self) -> JobSettings: ...
