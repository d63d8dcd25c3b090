"""What one server holds: settings, the engine, its scheduler and its metrics."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..engine import Engine
from .metrics import ServerMetrics
from .profiles import Profile
from .scheduler import Scheduler

MAX_BODY_BYTES = 4 << 20


@dataclass(frozen=True)
class ServerSettings:
    """How the server behaves; the command line maps onto this."""

    model_name: str  # the served model's name (--alias, else the target file's stem)
    profiles: dict[str, Profile] = field(default_factory=dict)  # name -> profile, the served model's first
    parallel: int = 2  # slots: requests generating at once
    queue: int = 16  # requests waiting for a slot before 503
    api_key: str | None = None
    max_body: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.model_name not in self.profiles:
            object.__setattr__(self, "profiles", {self.model_name: Profile(self.model_name), **self.profiles})
        if self.max_body < 1024:
            raise ValueError(f"max_body must be >= 1024 bytes, got {self.max_body}")


class ServerState:
    """Per-app state, reached from handlers as `request.app.state.server`."""

    def __init__(self, engine: Engine, settings: ServerSettings):
        self.engine = engine
        self.settings = settings
        self.profiles = settings.profiles
        self.scheduler = Scheduler(engine, settings.parallel, settings.queue)
        self.metrics = ServerMetrics(busy_slots=lambda: self.scheduler.pool.busy,
                                     queue_depth=lambda: self.scheduler.pool.waiting)

    def health(self) -> dict:
        pool = self.scheduler.pool
        return {
            "status": "draining" if self.scheduler.draining else "ok",
            "model": self.settings.model_name,
            "slots_idle": len(pool.slots) - pool.busy,
            "slots_processing": pool.busy,
            "queue_depth": pool.waiting,
            "queue_max": pool.max_waiting,
            "requests_active": self.scheduler.active,
            "rss_bytes": rss_bytes(),
        }


def rss_bytes() -> int:
    """This process's resident set size, from /proc (0 where there is none)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
