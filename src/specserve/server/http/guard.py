"""Who may call: the Host and Origin checks against browser attacks, and the API key.

A server on 127.0.0.1 is still reachable from any web page the user opens: the page can
POST to it (CSRF), or point a name it controls at 127.0.0.1 (DNS rebinding) and then
read the answers as same-origin. So, before anything runs:

- `Host` must name this server: an IP address, `localhost`, the bound name, or a name
  allowed with `--allowed-host` (`*` turns the check off). A rebinding page's Host is
  its own name, so it is refused.
- A request carrying a foreign `Origin` is refused unless `--cors-origin` allows it
  (same-origin requests, and clients that send no Origin, pass). POST bodies must be
  `application/json` (checked where the body is read): a browser cannot send that
  cross-origin without a CORS preflight, which is off by default. An allowed origin's preflight
  is answered as llama-server answers it (the origin, credentials, methods `GET, POST, DELETE,
  OPTIONS`, any header), and its requests' answers carry the origin and credentials headers.
  `localhost` in --cors-origin allows every loopback origin, any scheme and port (llama-server's).
- With keys set, every path except /health (and the chat page's own files, which hold no
  data: the page asks for the key) needs `Authorization: Bearer KEY` or
  `X-Api-Key: KEY` (as llama-server accepts). A key given a scope (`KEY scope=NAME` in
  --api-key-file) confines its requests to that cross-request scope, whatever they send.
"""
from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from .errors import OPENAI_SHAPES, ApiError, ErrorShapes, error_response

OPEN_PATHS = frozenset({"/health", "/v1/health"})  # answered without an API key (load balancers probe it)
KEY_SCOPE = "specserve.key_scope"  # ASGI scope entry: the cross-request scope the request's API key confines it to


def key_scope(scope) -> str | None:
    """The cross-request scope a request's API key confines it to (its ASGI scope's KEY_SCOPE), if any."""
    return scope.get(KEY_SCOPE)


def _hostname(authority: str) -> str | None:
    """The host part of a Host header or of an origin's authority: lowercased, no port, no brackets."""
    try:
        host = urlsplit("//" + authority).hostname
    except ValueError:
        return None
    return host.rstrip(".") if host else None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_allowed(host_header: str, allowed: frozenset[str]) -> bool:
    """Whether a Host header names this server. IP literals always do: rebinding needs a name."""
    if "*" in allowed:
        return True
    host = _hostname(host_header)
    return host is not None and (_is_ip(host) or host == "localhost" or host in allowed)


_LOOPBACK = ("localhost", "127.0.0.1", "::1")
PREFLIGHT_HEADERS = [(b"access-control-allow-credentials", b"true"),
                     (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                     (b"access-control-allow-headers", b"*"), (b"access-control-max-age", b"600")]


def listed(origin: str, cors_origins: frozenset[str]) -> bool:
    """Allowed cross-origin by --cors-origin: listed, `*`, or a loopback origin where `localhost` is listed."""
    if "*" in cors_origins or origin in cors_origins:
        return True
    if "localhost" in cors_origins:
        try:
            parts = urlsplit(origin)
            parts.port  # noqa: B018 (raises ValueError for a port that is not one)
            return parts.scheme in ("http", "https") and parts.hostname in _LOOPBACK
        except ValueError:
            return False
    return False


def origin_allowed(origin: str, host_header: str, cors_origins: frozenset[str]) -> bool:
    """Same-origin (the Origin's authority is the Host), or allowed by --cors-origin (`listed`)."""
    if listed(origin, cors_origins):
        return True
    return origin != "null" and urlsplit(origin).netloc.lower() == host_header.lower()


class HostOriginGuard:
    """400 for a Host that is not this server's, 403 for a foreign Origin, CORS for an allowed one; see the
    module docstring."""

    def __init__(self, app, allowed_hosts: frozenset[str], cors_origins: frozenset[str], on_error,
                 shapes: ErrorShapes = OPENAI_SHAPES):
        self.app = app
        self.shapes = shapes
        self.allowed_hosts = allowed_hosts
        self.cors_origins = cors_origins
        self.on_error = on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            host = headers.get(b"host", b"").decode("latin-1")
            origin = headers.get(b"origin")
            err = None
            if host and not host_allowed(host, self.allowed_hosts):
                err = ApiError(400, "the Host header does not name this server; to serve it under another name, "
                                    "start it with --allowed-host NAME", code="invalid_host")
            elif origin is not None and not origin_allowed(origin.decode("latin-1"), host, self.cors_origins):
                err = ApiError(403, "cross-origin requests are refused; to allow a web page's origin, start the "
                                    "server with --cors-origin ORIGIN", code="origin_not_allowed")
            if err is not None:
                self.on_error(err.status)
                await error_response(err, self.shapes(scope["path"]))(scope, receive, send)
                return
            if origin is not None and listed(origin.decode("latin-1"), self.cors_origins):
                cors = [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
                if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [*cors, *PREFLIGHT_HEADERS, (b"content-length", b"0")]})
                    await send({"type": "http.response.body", "body": b""})
                    return

                async def send_cors(message) -> None:
                    if message["type"] == "http.response.start":
                        message = {**message, "headers": [*message.get("headers", []), *cors,
                                                          (b"access-control-allow-credentials", b"true")]}
                    await send(message)
                return await self.app(scope, receive, send_cors)
        await self.app(scope, receive, send)


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer KEY` or `X-Api-Key: KEY` carries one of `keys`, except on OPEN_PATHS.
    A key listed in `scopes` confines its requests to that cross-request scope: the ASGI scope's
    KEY_SCOPE entry says which, and the endpoints apply it whatever the request sends."""

    def __init__(self, app, keys: tuple[str, ...], on_error, scopes: dict[str, str] | None = None,
                 open_paths: frozenset[str] = OPEN_PATHS, shapes: ErrorShapes = OPENAI_SHAPES):
        self.app = app
        self.shapes = shapes
        self.open_paths = open_paths
        self.keys = [k.encode() for k in keys]
        self.scopes = [(scopes or {}).get(k) for k in keys]
        self.on_error = on_error

    def _match(self, given: bytes) -> int:
        """The index of the key `given` is, or -1."""
        found = -1
        for i, key in enumerate(self.keys):  # every key compared, in constant time each
            if hmac.compare_digest(given, key):
                found = i
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open_paths and scope["method"] != "OPTIONS":
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"")
            given = bearer[7:] if bearer[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
            i = self._match(given)
            if i < 0:
                self.on_error(401)
                message = "invalid API key" if given else "missing API key"
                err = ApiError(401, f"{message}: send 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error_response(err, self.shapes(scope["path"]))(scope, receive, send)
                return
            if self.scopes[i] is not None:
                scope = {**scope, KEY_SCOPE: self.scopes[i]}
        await self.app(scope, receive, send)
