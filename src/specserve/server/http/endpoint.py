"""What an API adapter hands the app for each of its endpoints: path, handler, methods, error shape."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .errors import Render


@dataclass(frozen=True)
class Endpoint:
    """One route of an API. `render_error`: the API's error body for refusals on this path (None:
    OpenAI's)."""

    path: str
    handler: Callable[[Request], Awaitable[Response]]
    methods: tuple[str, ...] = ("POST",)
    render_error: Render | None = None

    def route(self) -> Route:
        return Route(self.path, self.handler, methods=list(self.methods))
