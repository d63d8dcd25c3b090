"""The chat page at `/` (docs/webui.md): three static files shipped in the package (data/webui/).

Read once when the app is made, served same-origin under a Content-Security-Policy that lets
the page load only its own script and style and talk only to this server. The files hold no
data, so they are served without the API key; the page asks for the key and sends it on every
API call. `--no-webui` leaves the routes out (`/` is then 404, as before).
"""
from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_FILES = {  # path -> (file in data/webui, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
}
PATHS = frozenset(_FILES)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def routes() -> list[Route]:
    """GET (and HEAD) routes for the page's files."""
    folder = resources.files("specserve") / "data" / "webui"
    out = []
    for path, (name, content_type) in _FILES.items():
        body = (folder / name).read_bytes()

        async def serve(request: Request, body: bytes = body, content_type: str = content_type) -> Response:
            return Response(body, media_type=content_type, headers=_HEADERS)
        out.append(Route(path, serve, methods=["GET"]))
    return out
