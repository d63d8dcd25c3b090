"""One engine replica: the single server's app (`server.create_app`) run in-process.

The ingress hands each request over as (routing key, ASGI scope, body); `handle` runs the
app on it and yields what the app sends: first {"status", "headers"}, then the body's
chunks as they come (an SSE stream chunk by chunk). So every endpoint, check, error and
metric is the single server's own. If the caller goes away (client disconnected, stream
cancelled) the app sees `http.disconnect`, exactly as under uvicorn, and stops the job.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass

from ray import serve

from ..config import ModelConfig
from ..loading import load_checked
from ..server import create_app, logsafe, server_of
from ..server.state import ServerSettings
from .registry import REPORT_EVERY_S

log = logging.getLogger("specserve.cluster")


@dataclass(frozen=True)
class ReplicaSpec:
    """What every engine replica loads and how it serves."""

    model: ModelConfig
    settings: ServerSettings


class EngineReplica:
    """Target, draft, slots and cross-request store: one specserve server without a listener."""

    def __init__(self, spec: ReplicaSpec, registry):
        logsafe.install()
        self.engine, warnings = load_checked(spec.model)  # a refused draft (PairingRefused) fails the replica
        for w in warnings:
            log.warning("%s", w)
        self.app = create_app(self.engine, spec.settings)
        self.state = server_of(self.app)
        self.registry = registry
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._reporter: asyncio.Task | None = None

    async def handle(self, key: str, scope: dict, body: bytes):
        """Run the app on one request; yields {"status", "headers"}, then body chunks (bytes).
        `key` is for the router (router.PrefixAffinityRouter), not used here."""
        self._start_reporting()
        sent: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        body_given = False

        async def receive() -> dict:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def run() -> None:
            try:
                await self.app(scope, receive, sent.put)
            finally:
                sent.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            while (msg := await sent.get()) is not None:
                if msg["type"] == "http.response.start":
                    yield {"status": msg["status"], "headers": list(msg.get("headers", []))}
                elif msg["type"] == "http.response.body" and msg.get("body"):
                    yield bytes(msg["body"])
            await task  # re-raises what the app raised after its response started
        finally:
            gone.set()  # the app sees the client go: the job stops and frees its slot
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), 10)
                task.cancel()

    async def check_health(self) -> None:
        """Ray Serve calls this periodically; raising marks the replica unhealthy (it is then replaced)."""
        if self.state.scheduler.closed:
            raise RuntimeError("the engine's scheduler is closed")
        self._start_reporting()

    def _report(self) -> dict:
        metrics = self.state.metrics
        return {"health": self.state.health(), "metrics": metrics.render().decode(),
                "scoped": {s: metrics.render(s).decode() for s in metrics.scoped},  # what a scoped key sees
                "pid": os.getpid(), "node": socket.gethostname()}

    def _start_reporting(self) -> None:
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())

    async def _report_loop(self) -> None:
        while True:
            try:
                await self.registry.report.remote(self.replica_id, self._report())
            except Exception as e:  # the registry restarting: report again next period
                log.debug("report to the registry failed: %s", e)
            await asyncio.sleep(REPORT_EVERY_S)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._reporter is not None:
                self._reporter.cancel()
            self.registry.leave.remote(self.replica_id)
        with contextlib.suppress(Exception):
            self.state.scheduler.close()  # the engine thread stops before the models are freed
            self.state.close_embedder()
            self.engine.close()
