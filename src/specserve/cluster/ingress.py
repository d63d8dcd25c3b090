"""The replicated endpoint's front: one HTTP app that forwards to the engine replicas.

Ray Serve's HTTP proxy hands every request to an ingress replica (no model, cheap). The
ingress applies the single server's access checks (`server.app.access_middleware`), reads
the body, computes its routing key (`routing.route_key`) and calls the engine deployment,
whose router (`router.PrefixAffinityRouter`) picks the replica. What the replica's app
answers is passed through unchanged: status, headers, and an SSE stream chunk by chunk.

Faults: a replica that dies before its answer has started is retried on another one
(up to RETRIES times, waiting a little longer each time): a generation with no visible output can be
run again. A plain JSON answer is only sent once complete, so it is retried too. A stream that had
already sent chunks ends with an OpenAI-shaped error event (code `replica_failed`) and no [DONE];
clients see a clear error, never a hang. No replica at all: 503 (code `no_replica`). /health and
/metrics cover every replica (see `registry`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..server.app import access_middleware
from ..server.http.body import read_body
from ..server.http.errors import ApiError, error_body, install_handlers
from ..server.http.guard import KEY_SCOPE
from ..server.state import ServerSettings
from . import metrics_merge
from .routing import route_key

log = logging.getLogger("specserve.cluster")
RETRIES = 3
RETRY_WAIT_S = 0.5  # Serve notices a dead replica within about a second; then the retry goes elsewhere
STATUS_CACHE_S = 1.0


def _replica_failure(exc: BaseException) -> bool:
    """A failure of the replica (process died, unreachable, no replica), not of the request."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import DeploymentUnavailableError

    return isinstance(exc, (RayActorError, DeploymentUnavailableError))


class Ingress:
    """The HTTP front: `__serve_build_asgi_app__` gives Ray Serve its app."""

    def __init__(self, engine, registry, settings: ServerSettings, app_name: str = "specserve"):
        self.engine = engine.options(stream=True, method_name="handle")
        self.registry = registry
        self.settings = settings
        self.app_name = app_name
        self.prom = CollectorRegistry()
        self.errors = Counter("specserve:request_errors", "Requests answered with an error, by HTTP status",
                              ["status"], registry=self.prom)
        self.retries = Counter("specserve:replica_retries", "Requests sent again after their replica failed",
                               registry=self.prom)
        self._status: tuple[float, dict] = (0.0, {})

    def __serve_build_asgi_app__(self):
        on_error = lambda status: self.errors.labels(str(status)).inc()  # noqa: E731
        app = Starlette(routes=[Route("/health", self.health, methods=["GET"]),
                                Route("/metrics", self.metrics, methods=["GET"]),
                                Route("/{path:path}", self.forward, methods=["GET", "POST"])],
                        middleware=access_middleware(self.settings, on_error))
        install_handlers(app, on_error)
        return app

    # -- /health and /metrics ------------------------------------------------------------------

    async def _deployment_status(self) -> dict:
        """The engine deployment's status and replica states from Serve's controller, cached a second."""
        at, status = self._status
        if time.monotonic() - at < STATUS_CACHE_S:
            return status
        try:
            from ray import serve

            app = (await asyncio.to_thread(serve.status)).applications[self.app_name]
            d = app.deployments["Engine"]
            status = {"status": _name(d.status), "replica_states": {_name(k): v for k, v in d.replica_states.items()}}
        except Exception as e:  # noqa: BLE001 - health must answer whatever the controller does
            status = {"status": "UNKNOWN", "message": f"{type(e).__name__}: {e}"[:200]}
        self._status = (time.monotonic(), status)
        return status

    async def health(self, request: Request) -> Response:
        """ok: every replica Serve wants is running and reporting; degraded: fewer (one died, one is
        starting), still serving; unavailable (503): none is reporting."""
        reports = await self.registry.snapshot.remote()
        deployment = await self._deployment_status()
        running = deployment.get("replica_states", {}).get("RUNNING", len(reports))
        live = len(reports)
        status = "unavailable" if live == 0 else \
            "ok" if deployment.get("status") == "HEALTHY" and live >= running else "degraded"
        replicas = [{"replica": rid, "pid": r["pid"], "node": r["node"], "age_s": r["age_s"], **r["health"]}
                    for rid, r in sorted(reports.items())]
        total = lambda k: sum(r["health"].get(k, 0) for r in reports.values())  # noqa: E731
        info = {"status": status, "model": self.settings.model_name, "replicas_reporting": live,
                "deployment": deployment, "slots_idle": total("slots_idle"),
                "slots_processing": total("slots_processing"), "queue_depth": total("queue_depth"),
                "requests_active": total("requests_active"), "rss_bytes": total("rss_bytes"), "replicas": replicas}
        return JSONResponse(info, status_code=503 if live == 0 else 200)

    async def metrics(self, request: Request) -> Response:
        """The replicas' metrics summed; for a key confined to a scope, that scope's requests alone."""
        reports = await self.registry.snapshot.remote()
        key_scope = request.scope.get(KEY_SCOPE)
        if key_scope is not None:
            text = metrics_merge.merge([r.get("scoped", {}).get(key_scope, "") for r in reports.values()])
            return Response(text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        text = metrics_merge.merge([r["metrics"] for r in reports.values()] + [generate_latest(self.prom).decode()],
                                   [("specserve:replicas_reporting", "Engine replicas whose metrics are summed here",
                                     len(reports))])
        return Response(text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # -- everything else goes to an engine replica ---------------------------------------------

    async def _read_body(self, request: Request) -> bytes:
        return await read_body(request, self.settings.max_body, self.settings.read_timeout)

    async def forward(self, request: Request) -> Response:
        body = await self._read_body(request) if request.method == "POST" else b""
        scope = {k: request.scope[k] for k in ("type", "http_version", "method", "scheme", "path", "raw_path",
                                              "query_string", "headers", "client", "server") if k in request.scope}
        scope["root_path"] = ""
        key = route_key(request.url.path, body)
        for attempt in range(RETRIES + 1):
            gen = self.engine.remote(key, scope, body)
            try:
                head = await gen.__anext__()
                if (dict(head["headers"]).get(b"content-type", b"")).startswith(b"text/event-stream"):
                    return self._stream(head, gen)
                chunks = [c async for c in gen]
                return Response(b"".join(chunks), status_code=head["status"], headers=_headers(head))
            except StopAsyncIteration:
                raise ApiError(500, "the replica sent no response", code="internal_error") from None
            except Exception as e:
                gen.cancel()
                if not _replica_failure(e):
                    raise
                if attempt == RETRIES:
                    log.warning("replica failed on %s, no retries left: %s", request.url.path, e)
                    raise ApiError(503, f"the replica serving this request failed ({type(e).__name__}) and so "
                                        f"did {RETRIES} retries; retry later", code="no_replica",
                                   headers={"Retry-After": "2"}) from None
                self.retries.inc()
                log.info("replica failed before answering %s (%s); retrying", request.url.path, type(e).__name__)
                await asyncio.sleep(RETRY_WAIT_S * (attempt + 1))
            except BaseException:
                gen.cancel()  # the client went away: the replica's app sees a disconnect
                raise

    def _stream(self, head: dict, gen) -> StreamingResponse:
        async def chunks():
            try:
                async for chunk in gen:
                    yield chunk
            except Exception as e:  # headers are sent: the error goes in the stream
                self.errors.labels("503").inc()
                log.warning("replica failed mid-stream: %s", e)
                body = error_body(503, f"the replica serving this stream failed mid-way ({type(e).__name__}); "
                                       "the text so far is incomplete: retry the request", code="replica_failed")
                yield ("data: " + json.dumps(body) + "\n\n").encode()
            finally:
                gen.cancel()  # no-op once finished; on a client disconnect it stops the job on the replica

        return StreamingResponse(chunks(), status_code=head["status"], headers=_headers(head))


def _name(enum_or_str) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))


def _headers(head: dict) -> dict[str, str]:
    skip = {b"content-length", b"transfer-encoding", b"connection"}  # set again by the front's server
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in head["headers"] if k.lower() not in skip}
