"""The HTTP listener: uvicorn with deadlines for slow clients and for draining.

- Headers: a connection must deliver a request's headers within `read_timeout` seconds
  of opening, or of its previous response, or it is closed (uvicorn has no such limit:
  a slowloris client that never ends its headers would hold its connection for ever).
  The body gets the same time again, checked where it is read (408).
- Connections: `max_connections` are served at once; a request on one more gets 503
  (uvicorn's limit_concurrency).
- Draining: the first SIGTERM/SIGINT stops new requests (503) and lets those in flight
  finish, for at most `drain_timeout` seconds; then queued requests get 503, streams end
  with an error event, and the process exits 0. A second signal ends the drain at once;
  a third exits without waiting for anything.
"""
from __future__ import annotations

import asyncio
import logging
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .jobs import stopping

log = logging.getLogger("specserve.server")


def header_deadline_protocol(base: type[asyncio.Protocol], timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base` (h11 or httptools), closing connections whose next
    request's headers do not arrive within `timeout` seconds."""

    class HeaderDeadline(base):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def connection_lost(self, exc) -> None:
            self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            self._header_timer = self.loop.call_later(timeout, self._header_deadline)

        def _header_deadline(self) -> None:
            waiting_for_headers = self.cycle is None or self.cycle.response_complete
            if waiting_for_headers and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline


class DrainingServer(uvicorn.Server):
    """uvicorn, with signals draining through the scheduler (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, scheduler, drain_timeout: float):
        super().__init__(config)
        self.scheduler = scheduler
        self.drain_timeout = drain_timeout
        self.drain_deadline = float("inf")
        self.signals = 0

    def handle_exit(self, sig, frame) -> None:
        # Not uvicorn's: it would re-raise the signal at exit, and the exit status must be 0.
        # A signal handler only sets flags; on_tick acts on them inside the event loop.
        self.signals += 1
        if self.signals == 1:
            self.scheduler.draining = True
            self.drain_deadline = time.monotonic() + self.drain_timeout
            log.info("draining: %d request(s) in flight, %g s at most; new requests get 503",
                     self.scheduler.active, self.drain_timeout)
        elif self.signals == 2:
            log.warning("second signal: ending the requests in flight now")
            self.drain_deadline = 0.0
        else:
            log.warning("third signal: exiting without waiting")
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        s = self.scheduler
        if s.draining:
            if not s.stopping and time.monotonic() >= self.drain_deadline:
                if not s.idle:
                    log.warning("drain deadline: ending %d request(s) still in flight", s.active)
                s.stop_requests(stopping)
            if s.idle:
                self.should_exit = True
        return await super().on_tick(counter)


def serve(app, host: str, port: int, settings) -> None:
    """Listen on host:port until a signal has drained the server. A failed bind exits with status 1."""
    # h11 and asyncio, named: uvicorn's "auto" switches to httptools and uvloop when they are installed
    # (Ray Serve pulls both in), and the server's timing under dropped streams must not change with that.
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                            loop="asyncio", timeout_keep_alive=5,
                            http=header_deadline_protocol(H11Protocol, settings.read_timeout),
                            limit_concurrency=settings.max_connections + 1,  # uvicorn counts the new one too
                            timeout_graceful_shutdown=5)
    DrainingServer(config, app.state.server.scheduler, settings.drain_timeout).run()
