"""Where the engine replicas report, so that the ingress can answer /health and /metrics for all.

Ray Serve routes each call to one replica; nothing asks all of them. So each engine replica
sends its health and its rendered metrics here every `REPORT_EVERY_S` seconds, and the
ingress reads the latest reports. A replica that stopped reporting for `STALE_AFTER_S`
seconds (dead, or paused) is left out; one shut down by Serve (downscaling) says goodbye.
The registry is a one-replica deployment: if it dies Serve restarts it, and within one
report period it knows every replica again.
"""
from __future__ import annotations

import time

REPORT_EVERY_S = 1.0
STALE_AFTER_S = 10.0  # generous: a replica's process may be paused for seconds on a busy machine


class Registry:
    """The latest report of each engine replica."""

    def __init__(self):
        self._reports: dict[str, dict] = {}  # replica id -> {"health", "metrics", "pid", "node", "at"}

    def report(self, replica_id: str, report: dict) -> None:
        self._reports[replica_id] = {**report, "at": time.monotonic()}

    def leave(self, replica_id: str) -> None:
        self._reports.pop(replica_id, None)

    def snapshot(self) -> dict[str, dict]:
        """Reports no older than STALE_AFTER_S, each with its age in seconds."""
        now = time.monotonic()
        for rid in [r for r, rep in self._reports.items() if now - rep["at"] > 10 * STALE_AFTER_S]:
            del self._reports[rid]  # long gone: forget it
        return {rid: {**{k: v for k, v in rep.items() if k != "at"}, "age_s": round(now - rep["at"], 2)}
                for rid, rep in self._reports.items() if now - rep["at"] <= STALE_AFTER_S}
