"""The HTTP listener: uvicorn with deadlines for slow clients, connection limits, and draining.

- Request line: a connection must deliver a full request line within `request_line_timeout`
  seconds of opening, or of its previous response, or it is closed: an idle connection
  costs a client nothing, so idle ones must not hold the server's places for long.
- Headers: a connection must deliver a request's headers within `read_timeout` seconds
  of opening, or of its previous response, or it is closed (uvicorn has no such limit:
  a slowloris client that never ends its headers would hold its connection for ever).
  The body gets the same time again, checked where it is read (408).
- Connections: one client address may hold `max_connections_per_client` open at once; a
  connection past that may ask for /health only (answered, then closed): anything else, or
  nothing within REFUSED_LINGER_S, is answered 503 and closed. `max_connections` are served at
  once; a request on one more gets 503, except /health. A load balancer that sees 503 there
  would take a busy server for a dead one, and behind a proxy on the same host every client
  has its address. Connections from a `--trusted-proxy` are not counted; their requests count,
  as requests in flight, against the client their X-Forwarded-For names (proxies.py).
- Draining: the first SIGTERM/SIGINT stops new requests (503) and lets those in flight
  finish, for at most `drain_timeout` seconds; then queued requests get 503, streams end
  with an error event, and the process exits 0. A second signal ends the drain at once;
  a third exits without waiting for anything.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import ApiError, error_body, error_response
from .guard import OPEN_PATHS
from .proxies import TrustedProxies

log = logging.getLogger("specserve.server")
REFUSED_LINGER_S = 1.0  # a connection past the per-client limit: time to ask for /health before its 503


def _too_many(message: str) -> ApiError:
    return ApiError(503, message, code="too_many_connections", headers={"Retry-After": "1", "Connection": "close"})


def _raw_503(message: str) -> bytes:
    body = json.dumps(error_body(503, message, code="too_many_connections")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)) + body


def guarded_protocol(base: type[asyncio.Protocol], settings, on_error=lambda status: None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base` (h11 or httptools) with the deadlines and connection
    limits of the module docstring, from `settings` (ServerSettings). `on_error(503)` counts refusals."""
    line_timeout, header_timeout = settings.request_line_timeout, settings.read_timeout
    per_client, most = settings.max_connections_per_client, settings.max_connections
    proxies = TrustedProxies(settings.trusted_proxies)
    per_client_message = (f"this client address has {per_client} connections open, the most it may; "
                          "close some or reuse them")
    refusal = _raw_503(per_client_message)
    open_by_client: dict[str, int] = {}
    in_flight_by_client: dict[str, int] = {}  # behind a trusted proxy: requests in flight per forwarded client
    refused_open = [0]  # connections past the per-client limit not yet closed: they take no place of max_connections

    class Guarded(base):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, **kw)
            inner = self.app

            async def app(scope, receive, send) -> None:  # the limits checked per request
                if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
                    await inner(scope, receive, send)
                    return
                served = len(self.connections) - refused_open[0]
                if self._refused or served > most:
                    on_error(503)
                    message = per_client_message if self._refused else \
                        f"the server has {most} connections open, the most it serves; retry later"
                    await error_response(_too_many(message))(scope, receive, send)
                    return
                client = proxies.client(scope["headers"]) if self._proxy and per_client else None
                if client is None:
                    await inner(scope, receive, send)
                    return
                if in_flight_by_client.get(client, 0) >= per_client:
                    on_error(503)
                    await error_response(_too_many(f"this client has {per_client} requests in flight through the "
                                                   "proxy, the most it may"))(scope, receive, send)
                    return
                in_flight_by_client[client] = in_flight_by_client.get(client, 0) + 1
                try:
                    await inner(scope, receive, send)
                finally:
                    left = in_flight_by_client.pop(client) - 1
                    if left:
                        in_flight_by_client[client] = left

            self.app = app

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._client_key = None
            self._refused = False
            host = self.client[0] if self.client else None
            self._proxy = proxies.trusts(host)
            if per_client and host is not None and not self._proxy:
                if open_by_client.get(host, 0) >= per_client:
                    self._refused = True  # it may ask for /health; anything else gets the 503
                    refused_open[0] += 1
                    self._linger = self.loop.call_later(REFUSED_LINGER_S, self._refuse)
                    self._arm_deadlines()
                    return
                open_by_client[host] = open_by_client.get(host, 0) + 1
                self._client_key = host
            self._arm_deadlines()

        def _refuse(self) -> None:
            """A connection past the per-client limit that has not asked for anything: 503, closed."""
            if self.cycle is None and not self.transport.is_closing():
                on_error(503)
                self.transport.write(refusal)
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                self._linger = self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self._refused and self.transport.is_closing():
                return  # answered already; nothing it sends is read
            if not self._line_seen and b"\n" in data:
                self._line_seen = True
                self._line_timer.cancel()
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._refused:  # one answer (/health, or the 503) and it is closed
                self.transport.close()
                return
            self._arm_deadlines()

        def connection_lost(self, exc) -> None:
            for timer in ("_header_timer", "_line_timer", "_linger"):
                if getattr(self, timer, None) is not None:
                    getattr(self, timer).cancel()
            if getattr(self, "_refused", False):
                self._refused = False
                refused_open[0] -= 1
            host = getattr(self, "_client_key", None)
            if host is not None:
                self._client_key = None
                left = open_by_client.get(host, 1) - 1
                if left > 0:
                    open_by_client[host] = left
                else:
                    open_by_client.pop(host, None)
            super().connection_lost(exc)

        def _arm_deadlines(self) -> None:
            for timer in ("_header_timer", "_line_timer"):
                if getattr(self, timer, None) is not None:
                    getattr(self, timer).cancel()
            self._line_seen = False
            self._header_timer = self.loop.call_later(header_timeout, self._deadline, False)
            self._line_timer = self.loop.call_later(line_timeout, self._deadline, True)

        def _deadline(self, line: bool) -> None:
            waiting_for_headers = self.cycle is None or self.cycle.response_complete
            if waiting_for_headers and not (line and self._line_seen) and not self.transport.is_closing():
                self.transport.close()

    return Guarded


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
                s.stop_requests()
            if s.idle:
                self.should_exit = True
        return await super().on_tick(counter)


def _sockets(hosts: list[str], port: int):
    """Listening sockets on each address (llama-server's --host A,B); SystemExit(1) if one cannot bind."""
    import socket

    socks = []
    for host in hosts:
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            log.error("cannot listen on %s port %d: %s", host, port, e)
            raise SystemExit(1) from None
        sock.listen(2048)
        socks.append(sock)
    return socks


def serve(app, host: str, port: int, settings, drain=None, on_error=None) -> None:
    """Listen on host:port (several comma-separated addresses: each) until a signal has drained the server.
    A failed bind exits with status 1. `drain` (what the drain watches: the scheduler's `draining`, `stopping`,
    `idle`, `active`, `stop_requests()`) and `on_error(status)` are the app's server's unless given (the router's)."""
    drain = app.state.server.scheduler if drain is None else drain
    on_error = app.state.server.metrics.error if on_error is None else on_error
    # h11 and asyncio, named: uvicorn's "auto" switches to httptools and uvloop when they are installed
    # (Ray Serve pulls both in), and the server's timing under dropped streams must not change with that.
    # No limit_concurrency: the protocol applies the connection limits itself, sparing /health.
    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="on",
                            loop="asyncio", timeout_keep_alive=5,
                            http=guarded_protocol(H11Protocol, settings, on_error),
                            timeout_graceful_shutdown=5)
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    server = DrainingServer(config, drain, settings.drain_timeout)
    server.run(sockets=_sockets(hosts, port) if len(hosts) > 1 else None)
